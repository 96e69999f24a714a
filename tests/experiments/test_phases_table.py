"""The phases table read off recorded rows, without an engine: the engine's step log where there is one, the
client's chunk times where there is none."""

from __future__ import annotations

from typing import Any

import pytest

from itlbench.experiments.phases_table import Sample, read_measurement, summarize

MS = 1_000_000


def _tables(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """One 16-token prefill request (TTFT 10 ms, then tokens 10 and 20 ms apart) and two streams decoding together."""
    requests = [{"request_id": "p16-0", "prompt_tokens": 16, "sent_ns": 0, "first_token_ns": 10 * MS,
                 "last_token_ns": 40 * MS, "server_request_id": "s1"},
                *({"request_id": f"d2-{i}", "prompt_tokens": 8, "sent_ns": 100 * MS, "first_token_ns": 110 * MS,
                   "last_token_ns": 140 * MS, "server_request_id": f"s{2 + i}"} for i in range(2))]
    chunks = [{"request_id": "p16-0", "t_ns": t * MS} for t in (10, 20, 40)]
    chunks += [{"request_id": f"d2-{i}", "t_ns": t * MS} for i in range(2) for t in (110, 114, 118, 140)]
    return {"requests": requests, "chunks": chunks, "steps": steps}


DECODE = [{"batch": 2, "keys": ["d2-0", "d2-1"], "from_ns": 100 * MS, "to_ns": 150 * MS}]


def test_without_a_step_log_the_client_times_are_the_table() -> None:
    samples, decode = read_measurement(_tables([]), DECODE)
    assert samples == [Sample(16, pytest.approx(0.010), pytest.approx(0.015), None)]
    assert decode[0]["engine_step_s"] is None and decode[0]["batch_measured"] == 2
    assert decode[0]["client_gap_s"] == pytest.approx(0.004)  # the median of 4, 4, 22 ms per stream
    assert decode[0]["tokens_per_s_total"] == pytest.approx(2 / 0.004)


def test_the_engine_step_log_wins_over_the_client_where_there_is_one() -> None:
    steps = [{"start_ns": 2 * MS, "end_ns": 9 * MS, "prefill_tokens": 16, "decode_tokens": 0,
              "prefill_request_ids": ["s1"]},
             *({"start_ns": (e - d) * MS, "end_ns": e * MS, "prefill_tokens": 0, "decode_tokens": 1}
               for e, d in ((19, 9), (30, 11), (40, 10))),
             *({"start_ns": s * MS, "end_ns": (s + 3) * MS, "prefill_tokens": 0, "decode_tokens": 2}
               for s in (111, 115, 119))]
    samples, decode = read_measurement(_tables(steps), DECODE)
    assert samples == [Sample(16, pytest.approx(0.010), pytest.approx(0.010), pytest.approx(0.007))]
    assert decode[0]["engine_step_s"] == pytest.approx(0.003) and decode[0]["engine_steps"] == 3
    rows, *_ = summarize(samples, [1, 16])
    assert [r["prompt_tokens"] for r in rows] == [16] and rows[0]["prefill_s"] == pytest.approx(0.007)
