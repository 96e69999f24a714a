"""Where a request's inferred prefill begins: the step after its send on a busy engine, the step it was
sent in when that step lasted on far past one cadence (an engine that admits a request on arrival)."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.inferred_steps import infer_steps

MS = 1_000_000
STREAMS = ("s0", "s1", "s2")


def _records(ticks_ms: list[float], late: dict[str, tuple[float, float]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Three streams advancing together at `ticks_ms` (30 µs apart within a tick); each request in `late`
    (id: (sent ms, first token ms)) sends then gets one token. The streams were sent at 0."""
    rows = [{"request_id": s, "index": i, "t_ns": int(t * MS) + 30_000 * j, "stamp": "kernel", "read_chunks": 1}
            for i, t in enumerate(ticks_ms) for j, s in enumerate(STREAMS)]
    rows += [{"request_id": r, "index": 0, "t_ns": int(first * MS), "stamp": "kernel", "read_chunks": 1}
             for r, (_, first) in late.items()]
    reqs = [{"request_id": r, "server_request_id": None, "sent_ns": int(sent * MS), "prompt_tokens": 8192,
             "prompt_tokens_reported": 8192, "cached_tokens_reported": 0}
            for r, (sent, _) in {**{s: (0.0, ticks_ms[0]) for s in STREAMS}, **late}.items()]
    return pl.DataFrame(rows), pl.DataFrame(reqs, schema_overrides={"server_request_id": pl.Utf8})


def _span(chunks: pl.DataFrame, reqs: pl.DataFrame, rid: str) -> tuple[float, float]:
    inferred = infer_steps(chunks, reqs)
    row = inferred.prefills.filter(pl.col("request_id") == rid).row(0, named=True)
    return row["start_ns"] / MS, row["end_ns"] / MS


def test_a_request_sent_inside_a_step_that_lasted_on_prefilled_in_it() -> None:
    # cadence 10 ms; R sent 3 ms after the tick at 100 ms; nothing advances until 510 ms; R's first token 520
    ticks = [10.0 * k for k in range(1, 11)] + [510.0 + 10.0 * k for k in range(0, 10)]
    chunks, reqs = _records(ticks, {"R": (103.0, 520.0)})
    start, end = _span(chunks, reqs, "R")
    assert start == 100.0 and 519.0 < end <= 520.0  # the silent step [100, 510] is R's


def test_on_a_busy_engine_a_request_joins_the_step_after_its_send() -> None:
    # R sent 3 ms after the tick at 100 ms; the step it was sent in ends on cadence at 110, then the long one
    ticks = [10.0 * k for k in range(1, 12)] + [520.0 + 10.0 * k for k in range(0, 10)]
    chunks, reqs = _records(ticks, {"R": (103.0, 530.0)})
    start, _ = _span(chunks, reqs, "R")
    assert start == 110.0  # [100, 110] was a decode step R waited out


def test_a_request_sent_during_an_earlier_prompts_prefill_does_not_take_it() -> None:
    # Q (sent at 95) prefills in [100, 510]; R, sent at 200 inside that step, prefills after it
    ticks = ([10.0 * k for k in range(1, 11)] + [510.0 + 10.0 * k for k in range(0, 2)]
             + [930.0 + 10.0 * k for k in range(0, 5)])
    chunks, reqs = _records(ticks, {"Q": (95.0, 510.09), "R": (200.0, 935.0)})
    q_start, _ = _span(chunks, reqs, "Q")
    r_start, _ = _span(chunks, reqs, "R")
    assert q_start == 100.0 and r_start >= 510.0
