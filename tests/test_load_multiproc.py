"""Several client processes: streams split across workers, records merged into one run directory."""

from __future__ import annotations

import asyncio

from itlbench.load.multiproc import drive_workers, split_plan
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan

from .load_helpers import closed, plans, table


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
