"""The engine cross-check: the worst client gap against the engine steps that ran inside it."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.crosscheck import engine_check, engine_check_line, worst_gap

MS = 1_000_000


def _chunks(times_ms: dict[str, list[int]]) -> pl.DataFrame:
    rows = [{"request_id": rid, "index": i, "t_ns": t * MS} for rid, ts in times_ms.items() for i, t in enumerate(ts)]
    return pl.DataFrame(rows)


def _steps(spans_ms: list[tuple[int, int]]) -> pl.DataFrame:
    return pl.DataFrame({"step": list(range(len(spans_ms))), "start_ns": [a * MS for a, _ in spans_ms],
                         "end_ns": [b * MS for _, b in spans_ms],
                         "prefill_request_ids": [[] for _ in spans_ms]},
                        schema_overrides={"prefill_request_ids": pl.List(pl.Utf8)})


def _no_requests() -> pl.DataFrame:
    return pl.DataFrame(schema={"request_id": pl.Utf8, "server_request_id": pl.Utf8, "injected": pl.Boolean,
                                "prompt_tokens": pl.Int64, "first_token_ns": pl.Int64, "scheduled_ns": pl.Int64})


def test_a_gap_spanning_two_long_steps_is_explained_by_both_not_by_the_longest() -> None:
    # stream b waits 1,000 -> 2,700 ms across two steps (600 + 900 ms) and an idle 200 ms between them
    chunks = _chunks({"a": [0, 100, 200], "b": [50, 1000, 2700, 2750]})
    steps = _steps([(0, 90), (100, 190), (1000, 1600), (1800, 2700), (2700, 2740)])
    worst = worst_gap(chunks)
    assert worst is not None and (worst.request_id, worst.start_ns, worst.end_ns) == ("b", 1000 * MS, 2700 * MS)
    check = engine_check(_no_requests(), chunks, steps)
    assert check["worst_client_gap_s"] == 1.7
    assert check["longest_step_s"] == 0.9
    assert check["worst_gap_steps"] == 2  # the steps that start exactly at the gap's end are outside it
    assert abs(check["worst_gap_engine_busy_s"] - 1.5) < 1e-9
    assert abs(check["worst_gap_unexplained_s"] - 0.2) < 1e-9
    assert check["worst_gap_longest_step_s"] == 0.9
    line = engine_check_line(check)
    assert line is not None and "(b): 2 engine steps" in line and "0.20 s not engine time" in line


def test_a_step_that_overhangs_the_gap_counts_only_inside_it() -> None:
    chunks = _chunks({"a": [0, 500]})
    steps = _steps([(-100, 300)])
    check = engine_check(_no_requests(), chunks, steps)
    assert abs(check["worst_gap_engine_busy_s"] - 0.3) < 1e-9
    assert abs(check["worst_gap_unexplained_s"] - 0.2) < 1e-9


def test_no_steps_no_check() -> None:
    assert engine_check(_no_requests(), _chunks({"a": [0, 5]}), _steps([]).clear()) == {"source": "unavailable"}
