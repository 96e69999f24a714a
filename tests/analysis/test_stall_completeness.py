"""Stalls no token closed, stalls every cause accounts for, tokens that came in together, preemptions
beside the prefix cache: what the QA peers (a frozen stream, a buffering proxy) and the simulator showed."""

from __future__ import annotations

import json

import polars as pl
import pytest

from itlbench.analysis import RunWindow, analyze_run, itl, summarize
from itlbench.rundir.schema import frame

MS = 1_000_000
WINDOW = RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=11_000 * MS)
EVERY_10MS = list(range(1000, 10_990, 10))  # a stream that stays in rhythm through the window


def _req(rid: str, sched: int, chunks: list[int], status: str = "ok", done: int | None = None,
         cached: int | None = None) -> dict[str, object]:
    return {"request_id": rid, "server_request_id": rid, "workload": "chat", "cls": "chat", "injected": False,
            "prompt_tokens": 100, "max_tokens": 2000, "scheduled_ns": sched * MS, "sent_ns": sched * MS,
            "first_token_ns": chunks[0] * MS if chunks else None,
            "last_token_ns": chunks[-1] * MS if chunks else None, "done_ns": None if done is None else done * MS,
            "output_tokens": len(chunks), "num_chunks": len(chunks), "status": status,
            "cached_tokens_reported": cached}


def _chunks(rid: str, times: list[int]) -> list[dict[str, object]]:
    return [{"request_id": rid, "index": i, "t_ns": t * MS, "n_tokens": 1} for i, t in enumerate(times)]


def _frozen_tables() -> dict[str, pl.DataFrame]:
    """`peer.py PORT stall 3`: sent in the warm-up, streams every 10 ms, freezes 0.44 s into the window
    and is cancelled by the drain after the window; a healthy stream beside it."""
    frozen = list(range(500, 1441, 10))
    return {"requests": frame("requests", [_req("frozen", 500, frozen, "cancelled", done=16_000),
                                           _req("ok", 1000, EVERY_10MS, done=10_990)]),
            "chunks": frame("chunks", _chunks("frozen", frozen) + _chunks("ok", EVERY_10MS))}


def test_a_stream_that_froze_and_never_resumed_is_a_stall():
    s = summarize(_frozen_tables(), WINDOW)
    stalls = s["stalls"]
    assert stalls["count"] == 1 and stalls["victims"] == 1
    assert stalls["worst_s"] == pytest.approx(11.0 - 1.44)  # censored at the window's end
    assert stalls["open"] == {"count": 1, "stalled_s": pytest.approx(9.56), "at_window_end": 1}
    assert stalls["by_cause"] == {"unknown": {"count": 1, "stalled_s": pytest.approx(9.56)}}
    assert stalls["by_unknown_reason"]["no_step_log"]["count"] == 1
    assert s["requests"]["in_flight_at_start"] == 1 and s["requests"]["in_flight_at_start_failed"] == 1


def test_every_stream_frozen_counts_every_stream():
    """`peer.py PORT stall 1`: no request scheduled in the window, yet both streams stalled through it."""
    times = list(range(500, 1201, 10))
    tables = {"requests": frame("requests", [_req(f"s{i}", 500, times, "cancelled", done=16_000) for i in range(2)]),
              "chunks": frame("chunks", _chunks("s0", times) + _chunks("s1", times))}
    s = summarize(tables, WINDOW)
    assert s["requests"]["total"] == 0 and s["requests"]["in_flight_at_start"] == 2
    assert s["stalls"]["count"] == 2 and s["stalls"]["open"]["at_window_end"] == 2


def test_a_stream_cut_while_stalled_is_counted_to_the_cut():
    times = list(range(1000, 2001, 10))
    gaps = itl.open_gap_table(frame("chunks", _chunks("t", times)),
                          frame("requests", [_req("t", 1000, times, "timeout", done=5000)]), 1000 * MS, 11_000 * MS)
    assert gaps["gap_s"].to_list() == [pytest.approx(3.0)] and gaps["censored"].to_list() == [False]


def test_a_finished_stream_leaves_no_open_gap():
    tables = _frozen_tables()
    gaps = itl.open_gap_table(tables["chunks"], tables["requests"], WINDOW.measure_start_ns, WINDOW.end_ns)
    assert gaps["request_id"].to_list() == ["frozen"]


def _step(i: int, start: int, end: int, prefill: int = 0, ids: tuple[str, ...] = ()) -> dict[str, object]:
    return {"step": i, "phase": "x", "prefill_tokens": prefill, "decode_tokens": 1, "start_ns": start * MS,
            "end_ns": end * MS, "prefill_request_ids": list(ids), "num_preemptions": 0}


def test_by_cause_sums_to_the_totals_when_a_prefill_ends_at_the_window_start():
    """The simulator's 70B run: a prefill step ending exactly when the window opened left the gaps it
    caused with no step in the window's log and no cause, so by_cause missed them."""
    times = [900, 910, 920, 1000, *range(1010, 10_990, 10)]
    steps = [_step(0, 920, 1000, prefill=5000, ids=("late",)),
             *[_step(i, 1000 + 10 * i, 1010 + 10 * i) for i in range(1, 100)]]  # the log ends at 2 s
    tables = {"requests": frame("requests", [_req("a", 900, times, done=10_990),
                                             _req("b", 2000, [2000, 2010, 2020, 2600, 2610], done=2610)]),
              "chunks": frame("chunks", _chunks("a", times) + _chunks("b", [2000, 2010, 2020, 2600, 2610])),
              "steps": frame("steps", steps)}
    stalls = summarize(tables, WINDOW)["stalls"]
    assert stalls["count"] == 2
    assert sum(v["count"] for v in stalls["by_cause"].values()) == stalls["count"]
    assert sum(v["stalled_s"] for v in stalls["by_cause"].values()) == pytest.approx(stalls["stalled_s"])
    assert stalls["by_cause"]["prefill"]["count"] == 1  # the gap straddling the window's start
    assert stalls["by_unknown_reason"] == {"no_steps": {"count": 1, "stalled_s": pytest.approx(0.58)}}


def test_tokens_that_arrived_together_withdraw_itl():
    """`peer.py PORT buffered 1`: each response arrives in one read, every gap 0 ms."""
    tables = {"requests": frame("requests", [_req(f"r{i}", 1000 + i * 500, [1400 + i * 500] * 50, done=1400 + i * 500)
                                             for i in range(4)]),
              "chunks": frame("chunks", [c for i in range(4) for c in _chunks(f"r{i}", [1400 + i * 500] * 50)])}
    s = summarize(tables, WINDOW)
    assert s["itl_s"]["max"] == 0.0
    assert s["arrived_together"]["fraction"] == 1.0
    assert "tokens arrived together (100% of 196 gaps are 0)" in s["arrived_together"]["warning"]
    assert s["valid"] is False and "itl_s" in s["validity"]["affected"]
    assert s["arrived_together"]["warning"] in s["validity"]["disturbances"]


def test_preemptions_are_named_beside_the_prefix_cache():
    steps = [{**_step(i, 1000 + 100 * i, 1100 + 100 * i), "num_preemptions": 2 if i % 3 == 0 else 0}
             for i in range(9)]
    tables = {**_frozen_tables(), "steps": frame("steps", steps)}
    tables["requests"] = tables["requests"].with_columns(pl.lit(40, dtype=pl.Int64).alias("cached_tokens_reported"))
    cache = summarize(tables, WINDOW)["cache"]
    assert cache["preemptions"] == 6 and cache["preemptions_run"] == 6
    assert any("6 preemptions in the window" in w and "re-prefill" in w for w in cache["warnings"])


def test_stored_run_counts_the_open_stall_too(tmp_path):
    """analyze_run reads the chunks partition by partition (analysis/scale.py): the same open stall."""
    for name, table in _frozen_tables().items():
        (tmp_path / name).mkdir()
        table.write_parquet(tmp_path / name / "part-0.parquet")
    (tmp_path / "run.json").write_text(json.dumps({"run_start_ns": 0, "measure_start_ns": 1000 * MS,
                                                   "end_ns": 11_000 * MS}))
    stalls = analyze_run(tmp_path)["stalls"]
    assert stalls["count"] == 1 and stalls["open"]["at_window_end"] == 1
    assert stalls["by_cause"]["unknown"]["count"] == 1
