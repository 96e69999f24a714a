"""`WorkerRun`: one Locust worker's share of an itlbench run, with every chunk's timestamp
(the process around it: `itlbench.load.locust.worker`).

The master sends the job when the worker connects; the worker rebuilds the same seeded plan
itself. Closed-loop streams run as Locust users (`ItlbenchUser`), each asking the master for a
stream index, so every stream runs exactly once whatever number of users Locust puts on each
worker. Open-loop plans (arrivals and injected prompts, one time-ordered feed) are split by worker
index as in `multiproc.split_plan`, so each fires exactly once across all workers; they run as
greenlets of the worker, not as users. The timeline follows the aiohttp driver (`load/driver.py`):
the master announces the start instant and the measurement window, the worker stops sending at the
window's end, drains for `drain_timeout_s` and cancels what is left (recorded "cancelled").

Records (the same request, chunk, client-sample and client-pause rows as the aiohttp driver) travel
to the master over Locust's message channel every `batch_interval_s`, column-wise; the master writes
them per worker. Times are perf_counter_ns converted to the master's clock (offset 0 on one host).
"""

from __future__ import annotations

# isort: off
import locust  # noqa: F401 - first: locust monkey-patches the process with gevent at import
# isort: on

import gc
import itertools
import logging
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

import gevent
import gevent.event
import gevent.pool
from gevent import GreenletExit
from locust.contrib.fasthttp import FastHttpSession
from locust.env import Environment

from itlbench.load.clients.sse import Outcome
from itlbench.load.driver import STATUSES, DriveResult
from itlbench.load.locust.client import GeventStreamClient
from itlbench.load.locust.job import (
    MSG_CLAIM,
    MSG_DONE,
    MSG_FIRST_TOKEN,
    MSG_ROWS,
    LocustJob,
)
from itlbench.load.multiproc import split_plan
from itlbench.load.observers.client_monitor import ClientMonitor, PauseWatchdog
from itlbench.load.progress import ProgressSnapshot, ms_percentile
from itlbench.load.streak import FailureStreak
from itlbench.workloads.trace import Trace

_now = time.perf_counter_ns
log = logging.getLogger("itlbench.locust.worker")
NEVER = sys.maxsize
PROBE_CLOCK_ENV = "ITLBENCH_LOCUST_PROBE_CLOCK"  # "1": estimate the clock offset even on the master's host


class RowBatcher:
    """RowWriter that keeps rows per table and hands them over column-wise, on the master's clock."""

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns
        self.rows: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows[table].append(row)

    def take(self) -> dict[str, dict[str, list[Any]]]:
        rows, self.rows = self.rows, defaultdict(list)
        out: dict[str, dict[str, list[Any]]] = {}
        for table, items in rows.items():
            if not items:
                continue
            cols = {key: [r.get(key) for r in items] for key in items[0]}
            if self.offset_ns:
                for key, values in cols.items():
                    if key.endswith("_ns"):
                        cols[key] = [None if v is None else v + self.offset_ns for v in values]
            out[table] = cols
        return out


class GeventMonitor(ClientMonitor):
    """ClientMonitor's samples, taken with a gevent sleep (the lag is how late the hub woke us)."""

    def tick_g(self) -> tuple[int, float, float]:
        intended = time.perf_counter() + self.interval_s
        gevent.sleep(self.interval_s)
        lag = max(0.0, time.perf_counter() - intended)
        cpu = self.proc.cpu_percent(None)
        self.lags.append(lag)
        self.cpus.append(cpu)
        return _now(), lag, cpu


class GeventPauseWatchdog(PauseWatchdog):
    """PauseWatchdog's loop on the gevent hub: late wakeups of a 5 ms timer, and long collections."""

    def run_g(self) -> None:
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                due = _now() + self.tick_ns
                gevent.sleep(self.tick_ns / 1e9)
                now = _now()
                if now - due > self.threshold_ns:
                    self._record(due, now, "loop")
        finally:
            gc.callbacks.remove(self._on_gc)


class WorkerRun:
    """One worker's share of the run: streams its users claim, every n-th open-loop plan."""

    def __init__(self, env: Environment, k: int, n: int, job: LocustJob, offset_ns: int,
                 trace: Trace | None = None) -> None:
        self.env, self.runner, self.k, self.n, self.job = env, env.runner, k, n, job
        self.offset_ns = offset_ns  # master clock - this worker's clock
        self.target = job.build_target()
        self.plan = job.build_plan(trace)  # `trace`: the launcher's, handed to a local worker (`trace_file`)
        self.streams_total = len(self.plan.streams)
        self.feed = split_plan(self.plan, k, n).open_loop
        self.warmup = job.build_warmup()
        self.sink = RowBatcher(offset_ns)
        self.client = GeventStreamClient(self.target, self.sink, self._first_token)
        self.open_session = FastHttpSession(self.target.base_url, env.events.request, None, concurrency=100_000,
                                            network_timeout=self.target.timeout_s or 1e9, connection_timeout=30.0,
                                            max_retries=0)
        self.monitor = GeventMonitor(job.sample_interval_s)
        self.watchdog = GeventPauseWatchdog(lambda row: self.sink.add("client_pauses", row))
        self.started = gevent.event.Event()
        self.measuring = gevent.event.Event()
        self.closed = gevent.event.Event()
        self.wake = gevent.event.Event()
        self.run_start_ns = 0
        self.measure_start_ns: int | None = None
        self.end_ns = NEVER
        self.stop_reason: str | None = None
        self.aborted_reason: str | None = None
        self.open_loop_truncated = False
        self.counts = dict.fromkeys(("sent", *STATUSES), 0)
        self.in_flight = 0
        self.send_lags: list[int] = []
        self.streak = FailureStreak(self.job.max_connection_errors)
        self.active: set[gevent.Greenlet] = set()
        self.requests = gevent.pool.Group()
        self.helpers = gevent.pool.Group()
        self.claims: dict[int, gevent.event.AsyncResult] = {}
        self._nonce = itertools.count()
        self.progress: ProgressSnapshot | None = None

    # --- messages from the master -------------------------------------------------------------
    def local(self, master_ns: int) -> int:
        return master_ns - self.offset_ns

    def on_go(self, data: dict[str, Any]) -> None:
        self.run_start_ns = self.local(data["run_start_ns"])
        if data.get("measure_start_ns") is not None:
            self.on_window(data)
        self.started.set()
        gevent.spawn(self.main)

    def on_window(self, data: dict[str, Any]) -> None:
        self.measure_start_ns = self.local(data["measure_start_ns"])
        self.end_ns = self.local(data["end_ns"])
        self.measuring.set()
        self.wake.set()

    def on_grant(self, data: dict[str, Any]) -> None:
        result = self.claims.pop(data["nonce"], None)
        if result is not None:
            result.set(data["stream"])

    def stop(self, reason: str) -> None:
        """Stop sending now; in-flight requests are cancelled without a drain."""
        if self.stop_reason is None and not self.closed.is_set():
            self.stop_reason = reason
        self.closed.set()
        self.wake.set()
        self.started.set()

    # --- what users and the open loop call ----------------------------------------------------
    def claim(self) -> int | None:
        """A closed-loop stream index from the master (None: every stream is taken)."""
        nonce = next(self._nonce)
        result = self.claims[nonce] = gevent.event.AsyncResult()
        self.runner.send_message(MSG_CLAIM, {"k": self.k, "nonce": nonce})
        return result.get()

    def pause(self, seconds: float) -> None:
        """Sleep, but wake as soon as sending is closed."""
        if seconds > 0 and not self.closed.is_set():
            self.closed.wait(seconds)

    def closed_stream(self, s: int, session: Any) -> None:
        """Stream `s`: each plan as soon as the previous one ended (plus its think time), until the end."""
        self.started.wait()
        ramp_ns = int(self.warmup.ramp_s * 1e9)
        first_at = self.run_start_ns + ramp_ns * s // max(1, self.streams_total)
        plans = iter(self.plan.streams[s])
        ready_ns = first_at
        while not self.closed.is_set():
            plan = next(plans, None)
            if plan is None:
                return
            due = max(ready_ns + int(plan.think_time_s * 1e9), first_at)
            if due >= self.end_ns:
                return
            self.pause((due - _now()) / 1e9)
            if self.closed.is_set():
                return
            self.send(plan, due, plan.stream if plan.stream is not None else s, session)
            ready_ns = _now()

    def send(self, plan: Any, scheduled_ns: int, stream: int | None, session: Any) -> Outcome | None:
        me = gevent.getcurrent()
        self.in_flight += 1
        self.counts["sent"] += 1
        self.active.add(me)
        try:
            out = self.client.run_g(plan, scheduled_ns, stream, session)
        except GreenletExit:
            self.counts["cancelled"] += 1
            raise
        finally:
            self.in_flight -= 1
            self.active.discard(me)
        self.counts[out.status] += 1
        if out.sent_ns is not None:
            self.send_lags.append(out.sent_ns - scheduled_ns)
        self._track_connection(out)
        if out.status == "ok" and out.first_token_ns is not None:  # for Locust's own statistics and UI
            fire = self.env.events.request.fire
            fire(request_type="TTFT", name=plan.cls, response_time=(out.first_token_ns - scheduled_ns) / 1e6,
                 response_length=0, exception=None, context={})
            fire(request_type="E2E", name=plan.cls, response_time=(_now() - scheduled_ns) / 1e6,
                 response_length=out.output_tokens, exception=None, context={})
        return out

    def _track_connection(self, out: Outcome) -> None:
        if (reason := self.streak.see(out)) is not None and self.aborted_reason is None:
            self.aborted_reason = reason
            self.closed.set()
            self.wake.set()

    def _first_token(self, stream: int) -> None:
        if self.measure_start_ns is None:
            self.runner.send_message(MSG_FIRST_TOKEN, {"k": self.k, "stream": stream})

    # --- the worker's own greenlets -----------------------------------------------------------
    def open_loop(self) -> None:
        """Send each plan at its time (counted from the start of measurement) without waiting for earlier ones."""
        gevent.wait([self.measuring, self.closed], count=1)
        if self.measure_start_ns is None or self.closed.is_set():
            return
        for plan in self.feed:
            due = self.measure_start_ns + int((plan.send_at_s or 0.0) * 1e9)
            if due >= self.end_ns:
                self.open_loop_truncated = True
                return
            self.pause((due - _now()) / 1e9)
            if self.closed.is_set():
                return
            self.requests.spawn(self.send, plan, due, None, self.open_session)

    def sample(self) -> None:
        while True:
            t, lag, cpu = self.monitor.tick_g()
            self.sink.add("client_samples", {"t_ns": t, "loop_lag_s": lag, "cpu_percent": cpu,
                                             "in_flight": self.in_flight})
            c, itl = self.counts, self.client.recent_itl_ns
            self.progress = ProgressSnapshot(
                elapsed_s=(t - self.run_start_ns) / 1e9, measuring=self.measuring.is_set(), sent=c["sent"],
                done=c["ok"] + c["error"] + c["timeout"] + c["cancelled"], in_flight=self.in_flight,
                errors=c["error"] + c["timeout"], itl_p50_ms=ms_percentile(itl, 50),
                itl_p99_ms=ms_percentile(itl, 99), ttft_p50_ms=ms_percentile(self.client.recent_ttft_ns, 50),
                cpu_percent=cpu, loop_lag_ms=lag * 1e3)

    def ship(self) -> None:
        """Hand the rows collected so far to the master (also the last call, after the drain)."""
        tables = self.sink.take()
        progress, self.progress = self.progress, None
        if tables or progress is not None:
            self.runner.send_message(MSG_ROWS, {"k": self.k, "tables": tables,
                                                "progress": asdict(progress) if progress else None})

    def ship_forever(self) -> None:
        while True:
            gevent.sleep(self.job.batch_interval_s)
            self.ship()

    def main(self) -> None:
        """The timeline: wait out the window (or a stop), drain, cancel the rest, report."""
        gc.collect()
        gc.freeze()  # see client_monitor.frozen_heap: a full collection then scans only the run's objects
        for fn in (self.sample, self.ship_forever, self.watchdog.run_g):
            self.helpers.spawn(fn)
        self.helpers.spawn(self.open_loop)
        while not self.closed.is_set():
            remaining = None if self.end_ns == NEVER else (self.end_ns - _now()) / 1e9
            if remaining is not None and remaining <= 0:
                break
            self.wake.wait(remaining)
            self.wake.clear()
        send_end = min(_now(), self.end_ns)
        self.closed.set()
        self._finish(0.0 if self.stop_reason else self.job.drain_timeout_s)
        self.helpers.kill(block=True, timeout=5)
        self.helpers.kill(block=False)
        gc.unfreeze()
        self.ship()
        self.runner.send_message(MSG_DONE, {"k": self.k, "result": self.result(send_end)})

    def _finish(self, timeout_s: float) -> None:
        """Let in-flight requests end within `timeout_s`, then cancel the rest (they record themselves)."""
        deadline = time.monotonic() + timeout_s
        while self.active and time.monotonic() < deadline:
            gevent.joinall(list(self.active), timeout=min(0.5, max(0.0, deadline - time.monotonic())), count=1)
        left = self.active | set(self.requests)  # in flight, or spawned and not yet sending
        for g in left:
            g.kill(block=False)
        gevent.joinall(list(left), timeout=10)

    def result(self, send_end: int) -> dict[str, Any]:
        stats = self.monitor.stats(self.send_lags)
        reason = self.stop_reason or ("aborted" if self.aborted_reason else "completed")
        measure = self.measure_start_ns if self.measure_start_ns is not None else self.run_start_ns
        o = self.offset_ns
        res = DriveResult(self.run_start_ns + o, measure + o, send_end + o, _now() + o, dict(self.counts), reason,
                          self.aborted_reason, self.open_loop_truncated, stats)
        return res.to_dict()
