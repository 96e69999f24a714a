"""Several client processes: streams split across workers, records merged into one run directory."""

from __future__ import annotations

import asyncio

import polars as pl

from itlbench.load.driver import Warmup
from itlbench.load.multiproc import drive_workers, split_plan
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan
from tests.support.load import closed, plans, table


def four_streams() -> LoadPlan:
    return closed(4, 5)


def test_split_plan_partitions_streams_and_feed():
    plan = LoadPlan(streams=[plans(f"s{k}", 1, count=1) for k in range(5)], open_loop=plans("o", 1, count=7))
    parts = [split_plan(plan, k, 2) for k in range(2)]
    assert [len(p.streams) for p in parts] == [3, 2]
    assert [r.request_id for r in parts[1].open_loop] == ["o-1", "o-3", "o-5"]


def test_workers_merge_into_one_run(tmp_path):
    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        store = RunStore(tmp_path)
        res = asyncio.run(drive_workers(four_streams, Target(url, "paced"), store, workers=2, duration_s=0.8))
        store.close()
    req = table(tmp_path, "requests")
    assert res.counts["ok"] == req.height > 8 and set(req["stream"].to_list()) == {0, 1, 2, 3}
    assert req["request_id"].n_unique() == req.height
    assert table(tmp_path, "chunks").height == req["num_chunks"].sum()
    assert table(tmp_path, "client_samples").height >= 2
    assert not (tmp_path / "workers").exists()
    assert res.run_start_ns <= req["sent_ns"].min() and res.stop_reason == "completed"


def test_workers_share_one_adaptive_warmup_and_the_ramp(tmp_path):
    """Measurement opens only once every stream in every worker has its first token, and the ramp
    spreads first sends by run-wide stream index, as in one process."""
    with serve_in_thread(PacedConfig(tick_s=0.01, first_delay_s=0.4)) as (_, url):
        store = RunStore(tmp_path)
        warmup = Warmup(min_s=0.05, adaptive=True, ramp_s=0.6)
        res = asyncio.run(drive_workers(four_streams, Target(url, "paced"), store, workers=2, duration_s=0.5,
                                        warmup=warmup))
        store.close()
    req = table(tmp_path, "requests")
    first = req.group_by("stream").agg(pl.col("sent_ns").min(), pl.col("first_token_ns").min()).sort("stream")
    assert first["stream"].to_list() == [0, 1, 2, 3]
    for k, sent in enumerate(first["sent_ns"].to_list()):
        assert sent >= res.run_start_ns + int(0.6e9) * k // 4  # never before its ramp slot
    assert res.measure_start_ns >= first["first_token_ns"].max()  # every stream warm, in both workers
