"""The client watching itself: event-loop lag, process CPU and in-flight count, sampled periodically.

A run is only trustworthy when the client kept up; these samples (table `client_samples`) let the
analysis flag runs where the client, not the server, was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import psutil

from itlbench.system.heap import freeze_heap


@dataclass
class ClientStats:
    """Summary of the client's own behaviour over a run (lags in seconds)."""

    samples: int = 0
    cpu_percent_mean: float = 0.0
    cpu_percent_max: float = 0.0
    cpu_seconds: float = 0.0
    loop_lag_p99_s: float = 0.0
    loop_lag_max_s: float = 0.0
    send_lag_p50_s: float | None = None
    send_lag_p99_s: float | None = None
    send_lag_max_s: float | None = None
    dropped_rows: dict[str, int] = field(default_factory=dict)
    stream_reader: str = "aiohttp"  # kernel | aiohttp: where chunk stamps came from
    kernel_clock: dict[str, int | None] | None = None  # kernel stamps' clock offset and its drift over the run

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ClientMonitor:
    """Samples lag (a sleep's actual minus intended wakeup), CPU % of this process and in-flight."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.proc = psutil.Process()
        self.lags: list[float] = []
        self.cpus: list[float] = []
        self._cpu0 = self._cpu_time()
        self.proc.cpu_percent(None)

    def _cpu_time(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    async def tick(self) -> tuple[int, float, float]:
        """Sleep one interval; return (t_ns, loop lag s, cpu %)."""
        intended = time.perf_counter() + self.interval_s
        await asyncio.sleep(self.interval_s)
        lag = max(0.0, time.perf_counter() - intended)
        cpu = self.proc.cpu_percent(None)
        self.lags.append(lag)
        self.cpus.append(cpu)
        return time.perf_counter_ns(), lag, cpu

    def stats(self, send_lags_ns: list[int]) -> ClientStats:
        s = ClientStats(samples=len(self.lags), cpu_seconds=self._cpu_time() - self._cpu0)
        if self.cpus:
            s.cpu_percent_mean = sum(self.cpus) / len(self.cpus)
            s.cpu_percent_max = max(self.cpus)
            s.loop_lag_p99_s = float(np.percentile(self.lags, 99))
            s.loop_lag_max_s = max(self.lags)
        if send_lags_ns:
            s.send_lag_p50_s, s.send_lag_p99_s = (float(v) / 1e9 for v in np.percentile(send_lags_ns, [50, 99]))
            s.send_lag_max_s = max(send_lags_ns) / 1e9
        return s


class PauseWatchdog:
    """Finds the moments the client could not have read a chunk on time, at millisecond resolution.

    A periodic sample every 0.5 s misses a 100 ms blockage between two samples, yet such a blockage
    delays every stream at once and shows up as a burst of chunks in one read. The watchdog wakes
    every `tick_s` and records any wakeup later than `threshold_s` as a "loop" pause; a gc callback
    records collections longer than `threshold_s` as "gc" pauses.
    On Linux a loop pause also says where the loop thread's time went (its schedstat): `cpu_s` on a
    CPU (a blocking call or long Python work on the loop), `runq_s` runnable but waiting for a CPU
    (other processes held the cores); the rest it slept (a blocking system call, or waiting for the
    GIL another thread of this process held).
    """

    def __init__(self, emit: Callable[[dict[str, object]], None], tick_s: float = 0.005,
                 threshold_s: float = 0.010) -> None:
        self.emit = emit
        self.tick_ns = int(tick_s * 1e9)
        self.threshold_ns = int(threshold_s * 1e9)
        self.pauses = 0
        self._gc_start = 0

    async def run(self) -> None:
        gc.callbacks.append(self._on_gc)
        sched = _ThreadSchedstat.open()
        try:
            before = sched.read() if sched else None
            while True:
                due = time.perf_counter_ns() + self.tick_ns
                await asyncio.sleep(self.tick_ns / 1e9)
                now = time.perf_counter_ns()
                after = sched.read() if sched else None
                if now - due > self.threshold_ns:
                    extra = {} if before is None or after is None else {
                        "cpu_s": (after[0] - before[0]) / 1e9, "runq_s": (after[1] - before[1]) / 1e9}
                    self._record(due, now, "loop", **extra)
                before = after
        finally:
            gc.callbacks.remove(self._on_gc)
            if sched:
                sched.close()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._gc_start = now
        elif self._gc_start and now - self._gc_start > self.threshold_ns:
            self._record(self._gc_start, now, "gc")

    def _record(self, start_ns: int, end_ns: int, kind: str, **extra: float) -> None:
        self.pauses += 1
        self.emit({"start_ns": start_ns, "end_ns": end_ns, "kind": kind, **extra})


class _ThreadSchedstat:
    """The calling thread's (on-CPU ns, runqueue-wait ns) from /proc (Linux); ~5 µs a read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls) -> _ThreadSchedstat | None:
        try:
            return cls(os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY))
        except OSError:
            return None

    def read(self) -> tuple[int, int] | None:
        try:
            on_cpu, waiting, _ = os.pread(self.fd, 128, 0).split()
            return int(on_cpu), int(waiting)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Move every object that exists before the load (imports, the plan) out of the collector's
    reach: a full collection during the run then scans only what the run allocated. Unfrozen, one
    collection of a CLI process's heap was measured at 143 ms, stalling every stream at once."""
    freeze_heap()
    try:
        yield
    finally:
        gc.unfreeze()
