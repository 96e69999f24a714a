"""Goodput judges a request of the window on all of its own gaps (docs/measures.md: "ITL p99 of each request's
own gaps"), not only those that arrived before the window closed: a request scheduled in the window that
froze in the drain missed its ITL target, though the pooled ITL (chunks by arrival) does not see that gap."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from itlbench.analysis import RunWindow, summarize
from itlbench.analysis.summary import analyze_run
from itlbench.rundir.schema import frame
from itlbench.rundir.store import RunStore

MS = 1_000_000
WINDOW = RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=2000 * MS)
# "late" streams 10 ms gaps in the window, then freezes 1.5 s after it closed; "steady" ends inside it
TIMES = {"late": [1500 + 10 * k for k in range(20)] + [3500, 3510], "steady": [1100 + 10 * k for k in range(20)]}


def _request(rid: str, times: list[int]) -> dict[str, object]:
    return {"request_id": rid, "server_request_id": f"s-{rid}", "workload": "chat", "cls": "chat", "injected": False,
            "stream": 0 if rid == "late" else 1, "prompt_tokens": 100, "max_tokens": len(times),
            "scheduled_ns": (times[0] - 50) * MS, "sent_ns": (times[0] - 50) * MS, "first_token_ns": times[0] * MS,
            "last_token_ns": times[-1] * MS, "done_ns": times[-1] * MS, "output_tokens": len(times),
            "num_chunks": len(times), "status": "ok"}


def _chunks() -> list[dict[str, object]]:
    return [{"request_id": rid, "index": i, "t_ns": t * MS, "n_tokens": 1}
            for rid, times in TIMES.items() for i, t in enumerate(times)]


def _check(summary: dict) -> None:
    goodput = summary["goodput"]
    assert (goodput["good"], goodput["total"]) == (1, 2)
    (miss,) = goodput["misses"]
    assert (miss["slo"], miss["missed"]) == ("itl_p99", 1)
    assert miss["worst_s"] > 1.0  # the 1.99 s gap of the drain weighs in its own p99
    assert summary["itl_s"]["max"] == pytest.approx(0.01)  # pooled ITL still counts arrivals in the window only


def test_in_memory_summary_judges_every_gap_of_a_window_request() -> None:
    requests = frame("requests", [_request(rid, times) for rid, times in TIMES.items()])
    _check(summarize({"requests": requests, "chunks": frame("chunks", _chunks())}, WINDOW))


def test_stored_run_judges_every_gap_of_a_window_request(tmp_path: Path) -> None:
    store = RunStore(tmp_path, flush_every_s=1e9)
    store.add_many("requests", [_request(rid, times) for rid, times in TIMES.items()])
    store.add_many("chunks", _chunks())
    store.close()
    (tmp_path / "run.json").write_text(json.dumps({"run_start_ns": 0, "measure_start_ns": WINDOW.measure_start_ns,
                                                   "end_ns": WINDOW.end_ns}))
    assert pl.read_parquet(tmp_path / "chunks").height == sum(len(t) for t in TIMES.values())
    _check(analyze_run(tmp_path))
