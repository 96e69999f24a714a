"""Split a load across worker processes when one client event loop cannot keep up.

Each worker builds the plan itself (`plan_factory` must be picklable: a module-level function or a
`functools.partial` of one, which may carry data the parent already has, such as a parsed trace), keeps streams `k, k+n, ...`, every n-th open-loop plan and every n-th arriving
session (each session whole), and runs `drive` on its own event loop into its own store
`run_dir/workers/<k>/`. All workers start on one
`perf_counter_ns` instant (CLOCK_MONOTONIC is shared by every process on a host), so their records
line up. At the end each worker's parts are concatenated into the main run directory as
`<table>/part-9NNNN.parquet` (N = worker) and the worker folders are removed.

A worker that dies or fails takes its share of the load with it, so what followed would measure another
load: the others are told to stop (one `halt` event, also set by the parent's stop event: Ctrl-C, SIGTERM),
the run ends `aborted` naming the worker, and the chunks of its unfinished requests are set aside in
`in_flight_chunks/` (kept, not analysed). Every record the workers wrote stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import os
import queue
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.load.aio import install_uvloop
from itlbench.load.driver import DriveResult, Shard, Warmup, drive
from itlbench.load.observers.client_monitor import ClientStats
from itlbench.load.progress import ProgressSnapshot
from itlbench.load.target import Target
from itlbench.rundir.schema import TABLES
from itlbench.rundir.store import RunStore
from itlbench.system.parent import die_with_parent
from itlbench.workloads.plan import LoadPlan

MERGED_PART_BASE = 90_000


def split_plan(plan: LoadPlan, k: int, n: int) -> LoadPlan:
    """Worker k's share: every n-th stream, open-loop plan and arriving session, starting at k (a session's
    turns all go to the one worker that starts it)."""
    return LoadPlan(streams=plan.streams[k::n], open_loop=itertools.islice(plan.open_loop, k, None, n),
                    description=plan.description, sessions=itertools.islice(plan.sessions, k, None, n))


def worker_dir(run_dir: str | Path, k: int) -> Path:
    return Path(run_dir) / "workers" / str(k)


def _worker(k: int, n: int, plan_factory: Callable[[], LoadPlan], target: Target, run_dir: str,
            kwargs: dict[str, Any], start_q: Any, out_q: Any, halt: Any) -> None:
    die_with_parent()  # a run killed with SIGKILL leaves no client process behind (its flushed parts stay)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent relays it as `halt`
    install_uvloop()
    store = RunStore(worker_dir(run_dir, k))
    try:
        full = plan_factory()
        ids = tuple(range(len(full.streams)))[k::n]
        plan = split_plan(full, k, n)
        out_q.put(("ready", k, None))
        start_at = _start_or_halt(start_q, halt)

        async def agree_measure_start(local_ns: int) -> int:
            out_q.put(("warm", k, local_ns))
            while not halt.is_set():  # poll, so a stopped run's thread does not block interpreter exit
                with contextlib.suppress(queue.Empty):
                    return int(await asyncio.to_thread(start_q.get, True, 0.1))
            return local_ns  # another worker is gone: no window will be agreed

        async def shard_run() -> DriveResult:
            stop = asyncio.Event()
            relay = asyncio.create_task(_relay(halt, stop))
            try:
                return await drive(plan, target, store, shard=Shard(ids, len(full.streams), start_at,
                                                                    agree_measure_start),
                                   on_progress=lambda s: out_q.put(("progress", k, s)), stop_event=stop, **kwargs)
            finally:
                relay.cancel()

        out_q.put(("done", k, asyncio.run(shard_run())))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        out_q.put(("failed", k, f"{type(e).__name__}: {e}"))
    finally:
        store.close()


def _start_or_halt(start_q: Any, halt: Any) -> int:
    """The common start instant, or now where the run was halted before it was handed out."""
    while not halt.is_set():
        with contextlib.suppress(queue.Empty):
            return int(start_q.get(True, 0.1))
    return time.perf_counter_ns()


async def _relay(halt: Any, stop: asyncio.Event) -> None:
    """Set the drive's stop event once the parent sets `halt` (a process-shared event cannot wake a loop,
    so it is polled: ten wake-ups a second)."""
    while not halt.is_set():
        await asyncio.sleep(0.1)
    stop.set()


class _Collector:
    """Reads worker messages. A worker that fails, dies or goes silent is noted in `lost` and `halt` tells
    the others to stop."""

    def __init__(self, q: Any, procs: list[Any], on_progress: Callable[[ProgressSnapshot], None] | None,
                 halt: Any) -> None:
        self.q, self.procs, self.on_progress, self.halt = q, procs, on_progress, halt
        self.results: dict[int, DriveResult] = {}
        self.lost: dict[int, str] = {}  # worker -> why it gave no result
        self.ready: set[int] = set()
        self.warm: dict[int, int] = {}  # worker -> when its streams were warm (perf_counter_ns)
        self.start_q: Any = None
        self.released = False
        self.progress: dict[int, ProgressSnapshot] = {}

    def settled(self) -> bool:
        return len(self.results) + len(self.lost) == len(self.procs)

    async def until(self, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                for k in range(len(self.procs)):
                    self._lose(k, f"did not report within {timeout_s:.0f} s")
                return
            try:
                kind, k, payload = await asyncio.to_thread(self.q.get, True, 0.25)
            except queue.Empty:
                self._check_alive()
                continue
            self._on_message(kind, k, payload)

    def _on_message(self, kind: str, k: int, payload: Any) -> None:
        if kind == "failed":
            self._lose(k, f"failed: {payload}")
        elif kind == "ready":
            self.ready.add(k)
        elif kind == "warm":
            self.warm[k] = payload
            self._release_if_all_warm()
        elif kind == "done":
            self.results[k] = payload
            self.warm.setdefault(k, payload.measure_start_ns)  # stopped before warming: never blocks the rest
            self._release_if_all_warm()
        elif kind == "progress":
            self.progress[k] = payload
            if self.on_progress is not None:
                self.on_progress(merge_progress(list(self.progress.values())))

    def _release_if_all_warm(self) -> None:
        """The last worker to warm up opens the one measurement window for all of them."""
        if len(self.warm) == len(self.procs) and not self.released:
            self.released = True
            for _ in self.procs:
                self.start_q.put(max(self.warm.values()))

    def _check_alive(self) -> None:
        for k, p in enumerate(self.procs):
            if p.exitcode not in (None, 0):
                self._lose(k, f"exited with {_exit_text(p.exitcode)}")

    def _lose(self, k: int, why: str) -> None:
        if k in self.results or k in self.lost:
            return
        self.lost[k] = why
        self.halt.set()


def _exit_text(code: int) -> str:
    """`code 3`, or the signal that ended it (`SIGKILL`): multiprocessing gives -N for signal N."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"code {code}"


async def drive_workers(plan_factory: Callable[[], LoadPlan], target: Target, store: RunStore, *, workers: int,
                        duration_s: float, warmup: Warmup | None = None, drain_timeout_s: float = 30.0,
                        on_progress: Callable[[ProgressSnapshot], None] | None = None,
                        stop_event: asyncio.Event | None = None, start_delay_s: float = 0.3,
                        **drive_kwargs: Any) -> DriveResult:
    """`drive` in `workers` processes with one warmup and one measurement window; returns the combined
    result after merging their records (`aborted`, naming the worker, where one was lost)."""
    if workers < 1:
        raise ConfigError("workers", f"must be >= 1, got {workers}")
    warmup = warmup or Warmup()
    ctx = mp.get_context("spawn")
    start_q, out_q, halt = ctx.Queue(), ctx.Queue(), ctx.Event()
    kwargs = dict(duration_s=duration_s, warmup=warmup, drain_timeout_s=drain_timeout_s, **drive_kwargs)
    procs = [ctx.Process(target=_worker, args=(k, workers, plan_factory, target, str(store.path), kwargs,
                                               start_q, out_q, halt)) for k in range(workers)]
    for p in procs:
        p.start()
    collector = _Collector(out_q, procs, on_progress, halt)
    collector.start_q = start_q
    relay = asyncio.ensure_future(_halt_on(stop_event, halt)) if stop_event is not None else None
    set_aside: dict[int, list[str]] = {}
    try:
        await collector.until(lambda: len(collector.ready) + len(collector.lost) == workers, 120.0)
        start_at = time.perf_counter_ns() + int(start_delay_s * 1e9)
        for _ in procs:
            start_q.put(start_at)
        budget = start_delay_s + max(warmup.min_s, warmup.max_s if warmup.adaptive else 0.0) + duration_s \
            + drain_timeout_s + 60.0
        await collector.until(collector.settled, budget)
    finally:
        halt.set()  # also where the parent was cancelled: the workers stop now, not at the window's end
        if relay is not None:
            relay.cancel()
        await asyncio.to_thread(_join, procs)
        merge_worker_parts(store.path, workers)
        set_aside = {k: set_aside_in_flight(store.path, k) for k in collector.lost}
    if not collector.results:
        raise ItlbenchError("every load worker was lost: " + _lost_text(collector.lost, set_aside))
    result = combine_results([collector.results[k] for k in sorted(collector.results)])
    if collector.lost:
        result = replace(result, stop_reason="aborted", aborted_reason=_lost_text(collector.lost, set_aside))
    return result


async def _halt_on(stop_event: asyncio.Event, halt: Any) -> None:
    await stop_event.wait()
    halt.set()


def _lost_text(lost: dict[int, str], set_aside: dict[int, list[str]]) -> str:
    """`load worker 0 exited with SIGKILL (3 requests in flight set aside in in_flight_chunks/); the others
    stopped`: why the run ended, for run.json and the terminal."""
    parts = []
    for k in sorted(lost):
        n = len(set_aside.get(k, []))
        aside = f" ({n} request(s) in flight set aside in {IN_FLIGHT_DIR}/)" if n else ""
        parts.append(f"load worker {k} {lost[k]}{aside}")
    return "; ".join(parts) + ": the other workers stopped, as their load alone would measure another one"


def _join(procs: list[Any], timeout_s: float = 30.0) -> None:
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.terminate()
            p.join(5)


def merge_worker_parts(run_dir: str | Path, workers: int) -> None:
    """Concatenate each worker's parts per table into the main run dir, then drop the worker folders."""
    run_dir = Path(run_dir)
    for k in range(workers):
        wdir = worker_dir(run_dir, k)
        for table in TABLES:
            parts = sorted((wdir / table).glob("part-*.parquet"))
            if not parts:
                continue
            frame = pl.concat([pl.read_parquet(p) for p in parts], how="vertical_relaxed")
            (run_dir / table).mkdir(parents=True, exist_ok=True)
            final = run_dir / table / f"part-{MERGED_PART_BASE + k:05d}.parquet"
            tmp = final.with_name("." + final.name + ".tmp")
            frame.write_parquet(tmp)
            os.replace(tmp, final)
    shutil.rmtree(run_dir / "workers", ignore_errors=True)


IN_FLIGHT_DIR = "in_flight_chunks"  # a lost worker's unfinished requests' chunks: kept, not analysed


def set_aside_in_flight(run_dir: str | Path, k: int) -> list[str]:
    """Set aside the chunks of a lost worker's requests in flight (they never got a row): in `chunks` the
    analysis would read each as a stream frozen until the window closed, an `outside_engine` stall the
    server never made. They move to IN_FLIGHT_DIR, so no record is lost. Returns their ids; the requests the
    worker finished keep their chunks."""
    run_dir = Path(run_dir)
    part = f"part-{MERGED_PART_BASE + k:05d}.parquet"
    chunks_path, requests_path = run_dir / "chunks" / part, run_dir / "requests" / part
    if not chunks_path.is_file():
        return []
    chunks = pl.read_parquet(chunks_path)
    done = (pl.read_parquet(requests_path, columns=["request_id"])["request_id"] if requests_path.is_file()
            else pl.Series("request_id", [], dtype=pl.Utf8))
    orphan = ~pl.col("request_id").is_in(done.implode())
    lost = chunks.filter(orphan)["request_id"].unique().sort().to_list()
    if lost:
        (run_dir / IN_FLIGHT_DIR).mkdir(exist_ok=True)
        chunks.filter(orphan).write_parquet(run_dir / IN_FLIGHT_DIR / part)
        tmp = chunks_path.with_name("." + part + ".tmp")
        chunks.filter(~orphan).write_parquet(tmp)
        os.replace(tmp, chunks_path)
    return lost


def combine_results(results: list[DriveResult]) -> DriveResult:
    """One result for all workers: union of windows, summed counts, the worst worker's client lags."""
    if not results:
        raise RuntimeError("no worker returned a result")
    counts: dict[str, int] = {}
    for r in results:
        for key, v in r.counts.items():
            counts[key] = counts.get(key, 0) + v
    reasons = [r.stop_reason for r in results if r.stop_reason != "completed"]
    aborted = next((r.aborted_reason for r in results if r.aborted_reason), None)
    return replace(results[0], run_start_ns=min(r.run_start_ns for r in results),
                   measure_start_ns=min(r.measure_start_ns for r in results),
                   end_ns=max(r.end_ns for r in results), finished_ns=max(r.finished_ns for r in results),
                   counts=counts, stop_reason=reasons[0] if reasons else "completed", aborted_reason=aborted,
                   open_loop_truncated=any(r.open_loop_truncated for r in results),
                   client=_combine_stats([r.client for r in results]))


def _worst(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _combine_stats(stats: list[ClientStats]) -> ClientStats:
    """CPU adds up across processes; lags are the worst worker's (a bound, not a pooled percentile)."""
    return ClientStats(
        samples=sum(s.samples for s in stats), cpu_percent_mean=sum(s.cpu_percent_mean for s in stats),
        cpu_percent_max=sum(s.cpu_percent_max for s in stats), cpu_seconds=sum(s.cpu_seconds for s in stats),
        loop_lag_p99_s=max(s.loop_lag_p99_s for s in stats), loop_lag_max_s=max(s.loop_lag_max_s for s in stats),
        send_lag_p50_s=_worst([s.send_lag_p50_s for s in stats]),
        send_lag_p99_s=_worst([s.send_lag_p99_s for s in stats]),
        send_lag_max_s=_worst([s.send_lag_max_s for s in stats]),
        stream_reader=stats[0].stream_reader,  # every worker selects it from the same target
        kernel_clock=max((s.kernel_clock for s in stats if s.kernel_clock), default=None,
                         key=lambda c: abs(c.get("drift_ns") or 0)))  # the worker whose clock moved most


def merge_progress(snaps: list[ProgressSnapshot]) -> ProgressSnapshot:
    """Counts add up; latencies and lag are the worst worker's."""
    return ProgressSnapshot(
        elapsed_s=max(s.elapsed_s for s in snaps), measuring=all(s.measuring for s in snaps),
        sent=sum(s.sent for s in snaps), done=sum(s.done for s in snaps), in_flight=sum(s.in_flight for s in snaps),
        errors=sum(s.errors for s in snaps), itl_p50_ms=_worst([s.itl_p50_ms for s in snaps]),
        itl_p99_ms=_worst([s.itl_p99_ms for s in snaps]), ttft_p50_ms=_worst([s.ttft_p50_ms for s in snaps]),
        cpu_percent=sum(s.cpu_percent for s in snaps), loop_lag_ms=max(s.loop_lag_ms for s in snaps))
