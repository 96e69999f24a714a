"""Several client processes: streams split across workers, records merged into one run directory."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import psutil

from itlbench.load.driver import DriveResult, Warmup
from itlbench.load.multiproc import IN_FLIGHT_DIR, drive_workers, split_plan
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan
from tests.support.load import closed, four_streams, plans, table


def four_long_streams() -> LoadPlan:
    return closed(4, 1000)


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


def _worker_pids() -> list[int]:
    """This process's spawned load workers, in start order (worker k is the k-th)."""
    kids = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
    return [p.pid for p in sorted(kids, key=lambda p: p.create_time())]


def _shipped(run_dir: Path, k: int, name: str) -> bool:
    return any((run_dir / "workers" / str(k) / name).glob("*.parquet"))


async def _until(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _stopped_mid_run(run_dir: Path, tick_s: float, plan: Callable[[], LoadPlan], ready: Callable[[], bool],
                     act: Callable[[], None], **kw: object) -> tuple[float, DriveResult]:
    """Drive two workers for a 30 s window, `act` once `ready`; (seconds from `act` to the drive's end, result)."""
    async def scenario(url: str) -> tuple[float, DriveResult]:
        store = RunStore(run_dir)
        drive = asyncio.ensure_future(drive_workers(plan, Target(url, "paced"), store, workers=2, duration_s=30.0,
                                                    **kw))
        await _until(ready)
        act()
        acted = time.monotonic()
        res = await drive
        store.close()
        return time.monotonic() - acted, res

    with serve_in_thread(PacedConfig(tick_s=tick_s)) as (_, url):
        return asyncio.run(scenario(url))


def test_a_killed_worker_ends_the_run_aborted_naming_it_and_every_record_stays(tmp_path):
    """A dead worker took its share of the load: the others stop (what followed would measure another load),
    the run ends `aborted` naming it and its signal, and its unfinished requests' chunks are set aside,
    not lost. Before, the parent raised and the run had no summary."""
    def kill_mid_request() -> None:
        assert not _shipped(tmp_path, 0, "requests"), "killed mid-request"
        os.kill(_worker_pids()[0], signal.SIGKILL)

    took_s, res = _stopped_mid_run(tmp_path, 0.005, four_long_streams,
                                   lambda: _shipped(tmp_path, 0, "chunks") and _shipped(tmp_path, 1, "chunks"),
                                   kill_mid_request, drain_timeout_s=2.0)
    assert took_s < 10, "the surviving worker stopped, not at the 30 s window's end"
    assert res.stop_reason == "aborted"
    assert res.aborted_reason.startswith("load worker 0 exited with SIGKILL (")
    kept = pl.read_parquet(tmp_path / IN_FLIGHT_DIR / "*.parquet")
    requests, chunks = table(tmp_path, "requests"), table(tmp_path, "chunks")
    assert set(kept["request_id"].unique().to_list()) == {"s0-0", "s2-0"}, "worker 0's streams' first requests"
    assert f"({2} request(s) in flight set aside in {IN_FLIGHT_DIR}/)" in res.aborted_reason
    assert chunks.filter(~pl.col("request_id").is_in(requests["request_id"].implode())).is_empty()
    assert set(requests["stream"].to_list()) == {1, 3}, "worker 1's interrupted requests are recorded"
    assert not (tmp_path / "workers").exists()


def test_the_stop_event_stops_every_worker_and_keeps_their_records(tmp_path):
    """Ctrl-C or SIGTERM on the parent (its stop event) reaches the workers: before, they ran to the window's end."""
    stop = asyncio.Event()
    took_s, res = _stopped_mid_run(tmp_path, 0.01, four_streams,
                                   lambda: _shipped(tmp_path, 0, "requests") and _shipped(tmp_path, 1, "requests"),
                                   stop.set, stop_event=stop)
    assert took_s < 5 and res.stop_reason == "stop_event" and res.aborted_reason is None
    assert set(table(tmp_path, "requests")["stream"].to_list()) == {0, 1, 2, 3}
