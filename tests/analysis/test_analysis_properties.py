"""Properties on random streams: the pooled view is numpy's linear percentile of all gaps, the
per-token view has one sample per token after the first chunk, stalls obey their definition."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.analysis import RunWindow, summarize
from itlbench.analysis.itl import gap_table, per_token, pooled
from itlbench.analysis.stalls import StallParams, find_stalls
from itlbench.rundir.schema import frame

streams = st.lists(
    st.lists(st.tuples(st.integers(1, 2_000_000_000), st.integers(1, 4)), min_size=1, max_size=30),
    min_size=1,
    max_size=6,
)


def _tables(data):
    chunks, reqs = [], []
    for r, stream in enumerate(data):
        t = 0
        reqs.append(
            {
                "request_id": f"r{r}",
                "cls": "chat",
                "injected": r == 0,
                "scheduled_ns": 0,
                "sent_ns": 0,
                "first_token_ns": stream[0][0],
                "prompt_tokens": 100,
                "status": "ok",
            }
        )
        for i, (dt, k) in enumerate(stream):
            t += dt
            chunks.append({"request_id": f"r{r}", "index": i, "t_ns": t, "n_tokens": k})
    return frame("chunks", chunks), frame("requests", reqs)


def _stalls_by_definition(data, factor: float, floor_s: float) -> tuple[set, set]:
    """Every gap ≥ max(factor × its own stream's median gap, floor), computed independently; and the
    gaps within rounding of their threshold, where float order may legitimately differ."""
    out, borderline = set(), set()
    for r, stream in enumerate(data):
        times = np.cumsum([dt for dt, _ in stream])
        own = np.diff(times) / 1e9
        if not len(own):
            continue
        threshold = max(factor * float(np.median(own)), floor_s)
        out |= {(f"r{r}", int(times[i + 1])) for i, gap in enumerate(own) if gap >= threshold}
        borderline |= {(f"r{r}", int(times[i + 1])) for i, gap in enumerate(own) if math.isclose(gap, threshold)}
    return out, borderline


@settings(max_examples=40, deadline=None)
@given(streams)
def test_views_match_definitions(data):
    chunks, reqs = _tables(data)
    gaps = gap_table(chunks, reqs)
    expected = np.array([dt / 1e9 for stream in data for dt, _ in stream[1:]])
    got = pooled(gaps)
    assert got["count"] == len(expected)
    if len(expected) >= 2:
        assert got["p50"] == pytest.approx(np.percentile(expected, 50), rel=1e-9)
    if len(expected) >= 10:
        assert got["p90"] == pytest.approx(np.percentile(expected, 90), rel=1e-9)
    else:
        assert got["p90"] is None  # too few gaps to support a p90
    if len(expected):
        assert got["max"] == pytest.approx(expected.max())
    assert per_token(gaps)["count"] == sum(k for stream in data for _, k in stream[1:])
    params = StallParams(factor=3.0, floor_s=0.5)
    reported = {(row["request_id"], row["t_ns"]) for row in find_stalls(gaps, params).iter_rows(named=True)}
    expected, borderline = _stalls_by_definition(data, factor=3.0, floor_s=0.5)
    assert reported - borderline == expected - borderline  # sound and complete
    json.dumps(summarize({"chunks": chunks, "requests": reqs}, RunWindow(0, 0, 10**11)), allow_nan=False)
