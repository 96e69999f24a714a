"""Drive a simulated engine in-process on a discrete-event clock: the load driver's timeline without
HTTP, sockets or sleeping.

The served path (`load.driver.drive` against the bundled server) spends a wall second for every
simulated second. Here the same `LoadPlan` — closed-loop streams (think time, ramp), the open-loop
feed (`--rate`, trace rows, injections), sessions arriving at `--rate` (agent: each then closed-loop
on a stream of its own until its last turn), adaptive warm-up, the measured window, the drain and the
request timeout — meets the same `Engine` (scheduler, block manager, simulated runner), but time is
the engine's `VirtualClock`: a step moves it by the step's predicted duration, an idle engine jumps it
to the next event (a send, the window opening or closing, a deadline).

What the client would have seen is written as it would have been, with no client in between:
a request is sent exactly when it is due (sent_ns = scheduled_ns) and reaches the engine at that
time (it is admitted at the first step boundary after it, as the served engine thread drains its
queue between steps); every token arrives at the end of the step that sampled it (chunks.stamp =
"virtual"). The engine's step log is written as the steps table, so the analysis links the two
exactly as it does for a served run.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from itlbench.core.engine import Engine
from itlbench.core.request import RequestOutput, SamplingParams
from itlbench.errors import ConfigError
from itlbench.load.driver import STATUSES, DriveResult, Warmup
from itlbench.load.observers.client_monitor import ClientStats
from itlbench.load.progress import ProgressSnapshot
from itlbench.load.streak import failures_reason
from itlbench.sim.runner import VirtualClock
from itlbench.workloads.plan import LoadPlan, RequestPlan, SessionPlan

VIRTUAL_STAMP = "virtual"  # chunks.stamp of a token's arrival on the virtual clock (the step's end)
PROGRESS_EVERY_S = 0.25  # wall seconds between progress snapshots (the live bar redraws at that pace)
MAX_WAITING = 1024  # the bundled server's queue limit (server.main.DEFAULT_MAX_WAITING): 429 beyond it


class RowWriter(Protocol):
    def add(self, table: str, row: dict[str, Any]) -> None: ...

    def add_many(self, table: str, rows: list[dict[str, Any]]) -> None: ...


@dataclass(frozen=True)
class VirtualLimits:
    """The drive's timeline, in seconds of simulated time (the flags of `itlbench run`)."""

    duration_s: float
    warmup: Warmup = field(default_factory=Warmup)
    drain_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    max_waiting: int = MAX_WAITING
    max_failures: int = 50  # the served driver's max_connection_errors: so many failed requests in a row abort


@dataclass
class _Live:
    """A request in the engine, and what its client has received so far."""

    plan: RequestPlan
    engine_id: str
    stream: int | None  # the requests.stream value: the plan's own stream, else the closed-loop index
    k: int | None  # the closed-loop stream (or session) that sends next when this one ends; None for open-loop sends
    scheduled_ns: int
    deadline_ns: int
    times: list[int] = field(default_factory=list)
    tokens: int = 0


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class VirtualDrive:
    """One run of `plan` against `engine` (whose runner must be on a `VirtualClock`); `run()` returns
    the DriveResult the served driver would, its times on the virtual clock."""

    def __init__(self, engine: Engine, plan: LoadPlan, out: RowWriter, limits: VirtualLimits,
                 on_progress: Callable[[ProgressSnapshot], None] | None = None) -> None:
        if not isinstance(engine.clock, VirtualClock):
            raise ConfigError("clock", "a virtual drive needs an engine on a VirtualClock",
                              "build it with sim.runner.offline_engine")
        self.engine, self.out, self.limits = engine, out, limits
        self.on_progress = on_progress
        self._reported_at = time.monotonic()  # wall clock: a snapshot every PROGRESS_EVERY_S, not every step
        self.clock: VirtualClock = engine.clock
        self._streams = [iter(s) for s in plan.streams]  # then one per session, as it arrives
        self._n_closed = len(self._streams)  # the run's own closed-loop streams (the adaptive warm-up's)
        self._sessions: Iterator[SessionPlan] = iter(plan.sessions)
        self._session_next: SessionPlan | None = next(self._sessions, None)
        self._feed: Iterator[RequestPlan] = iter(plan.open_loop)
        self._open_next: RequestPlan | None = next(self._feed, None)
        self._due: list[tuple[int, int, int, RequestPlan]] = []  # (due, order, stream, plan): next closed-loop sends
        self._order = itertools.count()
        self._first_at: list[int] = []
        self._live: dict[str, _Live] = {}
        self.counts = dict.fromkeys(("sent", *STATUSES), 0)
        self._with_tokens: set[int] = set()
        self._all_tokens_at: int | None = None
        self.measure_start_ns: int | None = None
        self.end_ns = sys.maxsize
        self.closed = False
        self.send_end_ns: int | None = None
        self.drain_deadline_ns = sys.maxsize
        self.truncated = False
        self.steps = 0
        self._failures_in_row = 0
        self._idle = True
        self.aborted_reason: str | None = None

    # ----------------------------------------------------------------- the event loop

    def run(self) -> DriveResult:
        start = self.clock.now_ns()
        self.run_start_ns = start
        w = self.limits.warmup
        self._min_end = start + _ns(w.min_s)
        self._max_end = start + _ns(max(w.max_s, w.min_s))
        total = self._n_closed
        ramp = _ns(w.ramp_s)
        self._first_at = [start + ramp * k // max(1, total) for k in range(total)]
        for k in range(total):
            self._queue_next(k, self._first_at[k])
        stop_reason, aborted = "completed", None
        try:
            aborted = self._loop()
        except KeyboardInterrupt:
            stop_reason = "interrupted"
            self._close(self.clock.now_ns())
            self._cancel_all(self.clock.now_ns())
        if aborted:
            stop_reason = "aborted"
        now = self.clock.now_ns()
        measure = self.measure_start_ns if self.measure_start_ns is not None else start
        send_end = self.send_end_ns if self.send_end_ns is not None else now
        stats = ClientStats(stream_reader=VIRTUAL_STAMP)
        return DriveResult(start, measure, send_end, now, dict(self.counts), stop_reason, aborted,
                           self.truncated, stats)

    def _loop(self) -> str | None:
        """Fire what is due, step the engine while it has work, else jump to the next event."""
        engine = self.engine
        while True:
            now = self.clock.now_ns()
            self._report(now)
            self._fire(now)
            if self.aborted_reason is not None:
                self._close(now)
                self._cancel_all(now)
                return self.aborted_reason
            if self.closed and not self._live and not self._sends_left():
                return None
            if engine.has_unfinished():
                last = engine.step_log.last_step
                outputs = engine.step()
                self._record_steps(last)
                self._deliver(outputs)
                if engine.step_log.last_step != last:
                    continue
                if self._waiting_sends(now):  # nothing was schedulable: sends due now reach the engine now
                    self._fire(now, idle=True)
                    continue
            nxt = self._next_event(now)
            if nxt is None:
                if engine.has_unfinished():
                    self._close(now)
                    self._cancel_all(now)
                    return "the simulated engine could not schedule its waiting requests and nothing else was due"
                return None
            self.clock.advance_to(nxt)

    def _report(self, now: int) -> None:
        """A progress snapshot on simulated time, at most every PROGRESS_EVERY_S of wall time (a long simulation
        showed a bar that never moved)."""
        if self.on_progress is None or time.monotonic() - self._reported_at < PROGRESS_EVERY_S:
            return
        self._reported_at = time.monotonic()
        c = self.counts
        done = sum(c[k] for k in STATUSES)
        measuring = self.measure_start_ns is not None and now >= self.measure_start_ns
        self.on_progress(ProgressSnapshot(
            elapsed_s=(now - self.run_start_ns) / 1e9, measuring=measuring, sent=c["sent"], done=done,
            in_flight=len(self._live), errors=done - c["ok"], itl_p50_ms=None, itl_p99_ms=None,
            ttft_p50_ms=None, cpu_percent=0.0, loop_lag_ms=0.0, virtual=True))

    def _fire(self, now: int, idle: bool = False) -> None:
        """Everything due by `now`, in the served driver's order: overdue requests time out (their
        streams' next sends become due), the window opens, sends due before its end go out, sending
        closes at its end, the drain ends."""
        for live in [v for v in self._live.values() if v.deadline_ns <= now]:
            self._end_early(live, "timeout", live.deadline_ns, "no complete answer within --request-timeout")
        if self.measure_start_ns is None:
            at = self._measure_start_at()
            if at is not None and at <= now:
                self.measure_start_ns = at
                self.end_ns = at + _ns(self.limits.duration_s)
        self._idle = idle or not self.engine.has_unfinished()  # as of `now`, before this instant's sends
        self._start_sessions(now)
        self._send_closed(now)
        self._send_open(now)
        if self.measure_start_ns is not None and now >= self.end_ns:
            self._close(self.end_ns)
        if self.closed and now >= self.drain_deadline_ns:
            self._cancel_all(self.drain_deadline_ns)

    def _measure_start_at(self) -> int | None:
        """When the warm-up ends (`load.driver._warm_up`): after min_s; adaptive, also once every
        closed-loop stream has a token, but never after max_s. None: not known yet."""
        w = self.limits.warmup
        if not w.adaptive or not self._n_closed:
            return self._min_end
        ready = self._all_tokens_at if self._all_tokens_at is not None else self._max_end
        if self._all_tokens_at is None and self.clock.now_ns() < self._max_end:
            return None
        return max(self._min_end, min(ready, self._max_end))

    def _next_event(self, now: int) -> int | None:
        times = [self._due[0][0]] if self._due else []
        if self.measure_start_ns is None:
            at = self._measure_start_at()
            times += [self._min_end, self._max_end] if at is None else [at]
        elif not self.closed:
            times.append(self.end_ns)
            if self._open_next is not None:
                times.append(self.measure_start_ns + _ns(self._open_next.send_at_s or 0.0))
            if self._session_next is not None:
                times.append(self.measure_start_ns + _ns(self._session_next.arrive_at_s))
        if self._live:
            times.append(min(v.deadline_ns for v in self._live.values()))
            if self.closed:
                times.append(self.drain_deadline_ns)
        later = [t for t in times if t > now]
        return min(later) if later else None

    # ----------------------------------------------------------------- sending

    def _queue_next(self, k: int, ready_ns: int) -> None:
        plan = next(self._streams[k], None)
        if plan is not None:
            due = max(ready_ns + _ns(plan.think_time_s), self._first_at[k])
            heapq.heappush(self._due, (due, next(self._order), k, plan))

    def _arrived(self, due: int, now: int) -> bool:
        """Whether a send due at `due` reaches the engine before the step about to start at `now`.
        One due exactly now was caused by what the last step delivered (a closed-loop answer's end):
        the served engine starts its next step before such a request can reach it, so it waits for
        the step after, unless the engine was idle (then every send due now starts at once)."""
        return due < now or (due == now and self._idle)

    def _start_sessions(self, now: int) -> None:
        """Sessions arrived by `now` become closed-loop streams, their first turn due at the arrival
        (`load.driver._arriving_sessions`); one arriving at or after the window's end ends the feed."""
        if self.measure_start_ns is None:
            return
        while self._session_next is not None and self.aborted_reason is None:
            due = self.measure_start_ns + _ns(self._session_next.arrive_at_s)
            if due >= self.end_ns:
                self.truncated = True
                self._session_next = None
                return
            if due > now:
                return
            self._streams.append(iter(self._session_next.turns))
            self._first_at.append(due)
            self._queue_next(len(self._streams) - 1, due)
            self._session_next = next(self._sessions, None)

    def _send_closed(self, now: int) -> None:
        while self._due and self._arrived(self._due[0][0], now) and self.aborted_reason is None:
            due, _, k, plan = heapq.heappop(self._due)
            if due >= self.end_ns:
                continue  # this stream is done: nothing is sent at or after the window's end
            self._send(plan, due, plan.stream if plan.stream is not None else k, k)

    def _send_open(self, now: int) -> None:
        if self.measure_start_ns is None:
            return
        while self._open_next is not None and self.aborted_reason is None:
            due = self.measure_start_ns + _ns(self._open_next.send_at_s or 0.0)
            if due >= self.end_ns:
                self.truncated = True
                self._open_next = None
                return
            if not self._arrived(due, now):
                return
            self._send(self._open_next, due, None, None)
            self._open_next = next(self._feed, None)

    def _send(self, plan: RequestPlan, due: int, stream: int | None, k: int | None) -> None:
        """What the bundled server does with the request: admit it (forced length, token-id prompt),
        or answer 400 (too long for the context) or 429 (queue full) at once."""
        self.counts["sent"] += 1
        live = _Live(plan, f"cmpl-{plan.request_id}", stream, k, due, due + _ns(self.limits.request_timeout_s))
        if self.engine.num_waiting >= self.limits.max_waiting:
            self._reject(live, 429, f"server over capacity: {self.engine.num_waiting} requests waiting")
            return
        sampling = SamplingParams(max_tokens=plan.max_tokens, min_tokens=plan.max_tokens, temperature=0.0,
                                  ignore_eos=True)
        try:
            self.engine.add_request(list(plan.prompt_token_ids or ()), sampling, live.engine_id, arrival_ns=due)
        except ConfigError as exc:
            self._reject(live, 400, f"{exc.field}: {exc.problem}")
            return
        self._live[live.engine_id] = live

    def _reject(self, live: _Live, http_status: int, error: str) -> None:
        self._write_request(live, "error", live.scheduled_ns, None, http_status=http_status, error=error,
                            error_kind="http_status")
        if live.k is not None:
            self._queue_next(live.k, live.scheduled_ns)

    def _waiting_sends(self, now: int) -> bool:
        """A send due by `now` that `_arrived` held back for the next step boundary."""
        if self._due and self._due[0][0] <= now:
            return True
        return (self._open_next is not None and self.measure_start_ns is not None
                and self.measure_start_ns + _ns(self._open_next.send_at_s or 0.0) <= now)

    def _sends_left(self) -> bool:
        """A send due before the window's end that has not reached the engine yet (see `_arrived`)."""
        if self._due and self._due[0][0] < self.end_ns:
            return True
        if (self._session_next is not None and self.measure_start_ns is not None
                and self.measure_start_ns + _ns(self._session_next.arrive_at_s) < self.end_ns):
            return True
        return (self._open_next is not None and self.measure_start_ns is not None
                and self.measure_start_ns + _ns(self._open_next.send_at_s or 0.0) < self.end_ns)

    def _close(self, at_ns: int) -> None:
        if not self.closed:
            self.closed = True
            self.send_end_ns = at_ns
            self.drain_deadline_ns = at_ns + _ns(self.limits.drain_timeout_s)
            self.end_ns = min(self.end_ns, at_ns)  # stopped early (interrupted, aborted): nothing more goes out

    # ----------------------------------------------------------------- receiving

    def _record_steps(self, last: int) -> None:
        log = self.engine.step_log
        if log.last_step == last:
            return
        rows = [rec.to_dict() for rec in log.since(last + 1)]
        self.steps += len(rows)
        self.out.add_many("steps", rows)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        chunks = []
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:
                continue
            if out.new_token_ids:
                chunks.append({"request_id": live.plan.request_id, "index": len(live.times), "t_ns": out.time_ns,
                               "n_tokens": len(out.new_token_ids), "stamp": VIRTUAL_STAMP,
                               "t_read_ns": out.time_ns, "read_chunks": 1})
                live.times.append(out.time_ns)
                live.tokens += len(out.new_token_ids)
                self._note_token(live, out.time_ns)
            if out.finished:
                del self._live[out.request_id]
                status = "cancelled" if out.finish_reason == "abort" else "ok"
                self._write_request(live, status, out.time_ns, out, finish_reason=out.finish_reason)
                if live.k is not None:
                    self._queue_next(live.k, out.time_ns)
        self.out.add_many("chunks", chunks)

    def _note_token(self, live: _Live, t_ns: int) -> None:
        if live.k is None or live.k >= self._n_closed or live.k in self._with_tokens:
            return
        self._with_tokens.add(live.k)
        if len(self._with_tokens) == self._n_closed and self._all_tokens_at is None:
            self._all_tokens_at = t_ns

    def _end_early(self, live: _Live, status: str, at_ns: int, error: str) -> None:
        """A timeout or the drain's end: the engine drops the request (its blocks freed)."""
        self.engine.abort(live.engine_id)
        del self._live[live.engine_id]
        self._write_request(live, status, at_ns, None, error=error, error_kind=status)
        if status == "timeout" and live.k is not None:
            self._queue_next(live.k, at_ns)  # the stream carries on, as a served client's does

    def _cancel_all(self, at_ns: int) -> None:
        for live in list(self._live.values()):
            self._end_early(live, "cancelled", at_ns, "still running when the drain ended")

    def _write_request(self, live: _Live, status: str, done_ns: int, out: RequestOutput | None, *,
                       http_status: int = 200, error: str | None = None, error_kind: str | None = None,
                       finish_reason: str | None = None) -> None:
        self.counts[status] += 1
        self._failures_in_row = 0 if status == "ok" else self._failures_in_row + 1
        if self._failures_in_row >= self.limits.max_failures and self.aborted_reason is None and not self.closed:
            self.aborted_reason = failures_reason(self._failures_in_row, error or error_kind or status)
        p = live.plan
        self.out.add("requests", {
            "request_id": p.request_id, "server_request_id": live.engine_id, "workload": p.workload,
            "cls": p.cls, "injected": p.injected, "stream": live.stream, "session": p.session, "turn": p.turn,
            "prompt_tokens": p.prompt_tokens, "max_tokens": p.max_tokens,
            "prompt_tokens_reported": out.num_prompt_tokens if out else None,
            "cached_tokens_reported": out.num_cached_tokens if out else None,
            "scheduled_ns": live.scheduled_ns, "sent_ns": live.scheduled_ns,
            "first_token_ns": live.times[0] if live.times else None,
            "last_token_ns": live.times[-1] if live.times else None,
            "first_answer_ns": live.times[0] if live.times else None, "reasoning_chunks": 0,
            "done_ns": done_ns, "output_tokens": live.tokens,
            "output_tokens_reported": out.num_output_tokens if out else None,
            "num_chunks": len(live.times), "status": status, "http_status": http_status,
            "error": error, "error_kind": error_kind, "finish_reason": finish_reason,
        })
