"""The load driver: closed-loop streams and an open-loop schedule against one target.

Timeline: `run_start` → warmup (see `Warmup`: fixed seconds, or adaptive: until every stream has
received a token) → `measure_start` → `duration_s` → end of sends → drain (`drain_timeout_s`) →
remaining requests cancelled (recorded "cancelled").
Closed-loop streams start sending at `run_start` (or spread over `ramp_s`), so the warmup fills the
server. Open-loop
`send_at_s` counts from `measure_start` (after the warmup); a plan due at or after the end of the
measurement window is not sent, and the feed (time-ordered) is not read further. An arriving session
(`LoadPlan.sessions`, agent --rate) starts at its `arrive_at_s`, likewise counted, as a closed-loop
stream of its own that ends after its last turn; drain, stop and cancel cover it as they cover requests.
Every request row carries `scheduled_ns` and `sent_ns`, so client send lag is part of the record.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from itlbench.errors import ConfigError
from itlbench.load.aio import finish, first_of, install_sigint
from itlbench.load.backoff import Backoff
from itlbench.load.clients.kclock import measure_offset
from itlbench.load.clients.kernel import make_stream_client
from itlbench.load.clients.sse import Outcome, StreamClient, StreamObserver
from itlbench.load.observers.client_monitor import ClientMonitor, ClientStats, PauseWatchdog, frozen_heap
from itlbench.load.progress import ProgressSnapshot, ms_percentile
from itlbench.load.sink import RowSink
from itlbench.load.streak import FailureStreak
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.workloads.build import check_load_shape
from itlbench.workloads.plan import LoadPlan, RequestPlan, SessionPlan

_now = time.perf_counter_ns
KERNEL_WATCHDOG_TICK_S = 0.025
STATUSES = ("ok", "error", "timeout", "cancelled")
_T = TypeVar("_T")

log = logging.getLogger(__name__)


class DriveObserver(StreamObserver, Protocol):
    """A StreamObserver that also sees the client's own samples and pauses (their rows)."""

    def on_sample(self, row: dict[str, Any]) -> None: ...

    def on_pause(self, row: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Warmup:
    """When measurement starts. Fixed: `min_s` after the start. Adaptive: also not before every
    closed-loop stream has received a token, and at most `max_s`. `ramp_s` spreads the closed-loop
    streams' first sends evenly over that many seconds instead of starting them all at once."""

    min_s: float = 0.0
    adaptive: bool = False
    max_s: float = 300.0
    ramp_s: float = 0.0


@dataclass(frozen=True)
class Shard:
    """This process's part of a load split over several client processes (see `load.multiproc`).

    `stream_ids` are the run-wide indices of this shard's streams out of `total_streams`, so ramps
    and stream numbers match a single-process run; all shards start on `start_at_ns` (CLOCK_MONOTONIC
    is shared by the processes of a host); `agree_measure_start(local_ns)` reports when this shard is
    warm and returns the run-wide measurement start (the latest shard's), so every process measures
    one window."""

    stream_ids: tuple[int, ...]
    total_streams: int
    start_at_ns: int
    agree_measure_start: Callable[[int], Awaitable[int]] | None = None


@dataclass
class DriveResult:
    """What happened, on the perf_counter_ns clock. `end_ns` is when sending stopped."""

    run_start_ns: int
    measure_start_ns: int
    end_ns: int
    finished_ns: int
    counts: dict[str, int]
    stop_reason: str  # completed | stop_event | interrupted | aborted
    aborted_reason: str | None = None
    open_loop_truncated: bool = False
    client: ClientStats = field(default_factory=ClientStats)
    rate_limited: dict[str, float | int] | None = None  # the waits a 429/503 asked for (load.backoff)
    warmup_timeout: dict[str, Any] | None = None  # the adaptive warm-up gave up on these streams' first token

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _Run:
    """State shared by the stream tasks, the scheduler and the sampler of one drive() call."""

    def __init__(self, client: StreamClient, max_connection_errors: int) -> None:
        self.client = client
        self.closed = asyncio.Event()
        self.stop_reason: str | None = None
        self.aborted_reason: str | None = None
        self.counts = dict.fromkeys(("sent", *STATUSES), 0)
        self.in_flight = 0
        self.streak = FailureStreak(max_connection_errors)
        self.backoff = Backoff()
        self.send_lags: list[int] = []
        self.requests: set[asyncio.Task[Any]] = set()  # open-loop sends and running sessions
        self.open_loop_truncated = False
        # The measurement window: known once warmup ends (end_ns is open until then).
        self.measure_start_ns: int | None = None
        self.end_ns = sys.maxsize
        self.measuring = asyncio.Event()
        self.duration_s = 0.0
        self.waiting_for: str | None = None  # the stream the adaptive warm-up waits on ("s03"), for the live line
        self.warmup_timeout: dict[str, Any] | None = None  # set when the warm-up's limit passed without it
        self.ok_at_measure = 0

    def start_measuring(self, at_ns: int, duration_s: float) -> None:
        self.measure_start_ns = at_ns
        self.end_ns = at_ns + int(duration_s * 1e9)
        self.ok_at_measure = self.counts["ok"]
        self.measuring.set()

    def measured_nothing_after_warmup_timeout(self) -> str | None:
        """An abort's reason when the warm-up gave up on a first token and then no request succeeded."""
        if self.warmup_timeout is None or self.counts["ok"] > self.ok_at_measure:
            return None
        t = self.warmup_timeout
        return (f"the warm-up waited {t['waited_s']:.0f} s for the first token of stream(s) "
                f"{', '.join(t['streams_without_token'])}, which never came, and no request then succeeded")

    def stop(self, reason: str) -> None:
        """Stop sending now; in-flight requests are cancelled without a drain."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.closed.set()

    async def pause(self, seconds: float) -> None:
        """Sleep, but wake as soon as sending is closed."""
        if seconds <= 0 or self.closed.is_set():
            return
        try:
            await asyncio.wait_for(self.closed.wait(), seconds)
        except TimeoutError:
            pass

    async def send(self, plan: RequestPlan, scheduled_ns: int, stream: int | None) -> Outcome:
        self.in_flight += 1
        self.counts["sent"] += 1
        try:
            out = await self.client.run(plan, scheduled_ns, stream)
        except asyncio.CancelledError:
            self.counts["cancelled"] += 1
            raise
        finally:
            self.in_flight -= 1
        self.counts[out.status] += 1
        if out.sent_ns is not None:
            self.send_lags.append(out.sent_ns - scheduled_ns)
        self._track_connection(out)
        return out

    def _track_connection(self, out: Outcome) -> None:
        if (reason := self.streak.see(out)) is not None and self.aborted_reason is None:
            self.aborted_reason = reason
            self.closed.set()

    def snapshot(self, elapsed_s: float, measuring: bool, cpu: float, lag_s: float) -> ProgressSnapshot:
        c = self.counts
        itl = self.client.recent_itl_ns
        return ProgressSnapshot(
            elapsed_s=elapsed_s, measuring=measuring, sent=c["sent"],
            done=c["ok"] + c["error"] + c["timeout"] + c["cancelled"], in_flight=self.in_flight,
            errors=c["error"] + c["timeout"], itl_p50_ms=ms_percentile(itl, 50), itl_p99_ms=ms_percentile(itl, 99),
            ttft_p50_ms=ms_percentile(self.client.recent_ttft_ns, 50), cpu_percent=cpu, loop_lag_ms=lag_s * 1e3,
            waiting_for=self.waiting_for)


async def _closed_stream(run: _Run, k: int, plans: Iterator[RequestPlan], first_at_ns: int) -> None:
    """Send each plan as soon as the previous one ended (plus its think time), until the end."""
    ready_ns = first_at_ns
    while not run.closed.is_set():
        plan = next(plans, None)
        if plan is None:
            return
        due = max(ready_ns + int(plan.think_time_s * 1e9), first_at_ns)
        if due >= run.end_ns:
            return
        await run.pause((due - _now()) / 1e9)
        if run.closed.is_set():
            return
        out = await run.send(plan, due, plan.stream if plan.stream is not None else k)
        await run.pause(run.backoff.wait_for(k, out.http_status, out.retry_after))  # a 429/503's Retry-After
        ready_ns = _now()


async def _at_their_times(run: _Run, items: Iterator[_T], at_s: Callable[[_T], float],
                          start: Callable[[_T, int], Coroutine[Any, Any, Any]]) -> None:
    """Start each item at its time (counted from the start of measurement) without waiting for earlier ones;
    none due after the window's end."""
    await first_of(run.measuring.wait(), run.closed.wait())
    if run.measure_start_ns is None or run.closed.is_set():
        return
    for item in items:
        due = run.measure_start_ns + int(at_s(item) * 1e9)
        if due >= run.end_ns:
            run.open_loop_truncated = True
            return
        await run.pause((due - _now()) / 1e9)
        if run.closed.is_set():
            return
        task = asyncio.create_task(start(item, due))
        run.requests.add(task)
        task.add_done_callback(run.requests.discard)


async def _open_loop(run: _Run, feed: Iterator[RequestPlan]) -> None:
    """Send each plan at its time without waiting for earlier ones."""
    await _at_their_times(run, feed, lambda plan: plan.send_at_s or 0.0, lambda plan, due: run.send(plan, due, None))


async def _arriving_sessions(run: _Run, feed: Iterator[SessionPlan]) -> None:
    """Start each session at its arrival as a closed-loop stream of its own: its first turn at once, each later
    one after the previous answer plus its think time."""
    await _at_their_times(run, feed, lambda session: session.arrive_at_s,
                          lambda session, due: _closed_stream(run, session.stream, iter(session.turns), due))


async def _sample(run: _Run, monitor: ClientMonitor, sink: RowSink, run_start_ns: int,
                  on_progress: Callable[[ProgressSnapshot], None] | None,
                  on_sample: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Every interval: a client_samples row, a progress snapshot, and a hand-off of rows to the store."""
    while True:
        t, lag, cpu = await monitor.tick()
        row = {"t_ns": t, "loop_lag_s": lag, "cpu_percent": cpu, "in_flight": run.in_flight,
               "clock_offset_ns": measure_offset(samples=8).offset_ns}
        sink.add("client_samples", row)
        if on_sample is not None:
            on_sample(row)
        if on_progress is not None:
            try:
                on_progress(run.snapshot((t - run_start_ns) / 1e9, run.measuring.is_set(), cpu, lag))
            except Exception:  # a broken display must never stop the sampling and flushing of records
                log.exception("progress callback failed; live progress disabled")
                on_progress = None
        await sink.pump()


Hook = Callable[[], Awaitable[object]]


async def _warm_up(run: _Run, run_start_ns: int, warmup: Warmup, streams: int, shard: Shard | None,
                   before_measure: Hook | None = None) -> None:
    """End the warmup: after `min_s`, and (adaptive) once every closed-loop stream has received a
    token, so the measurement does not open on the thundering-herd prefill of the first requests;
    never later than `max_s`. `before_measure` (a baseline /metrics scrape) runs to its end before
    the window opens, so it never overlaps the measurement. A shard agrees the start with the other
    processes."""
    min_end = run_start_ns + int(warmup.min_s * 1e9)
    max_end = run_start_ns + int(max(warmup.max_s, warmup.min_s) * 1e9)
    await run.pause((min_end - _now()) / 1e9)
    if warmup.adaptive and streams:
        ids = list(shard.stream_ids) if shard is not None else list(range(streams))
        while not run.closed.is_set() and _now() < max_end and len(run.client.streams_with_tokens) < streams:
            _note_waiting(run, ids)
            await run.pause(0.02)
        if not run.closed.is_set() and len(run.client.streams_with_tokens) < streams:
            _warmup_gave_up(run, ids, (_now() - run_start_ns) / 1e9)
        run.waiting_for = None
    start = min_end if not warmup.adaptive else max(min_end, _now())
    if before_measure is not None and not run.closed.is_set():
        await before_measure()
        start = max(start, _now())
    if shard is not None and shard.agree_measure_start is not None and not run.closed.is_set():
        start = await shard.agree_measure_start(start)
    run.start_measuring(start, run.duration_s)


def _note_waiting(run: _Run, ids: list[int]) -> None:
    """Name the stream the warm-up waits on (live line and log), so a first token that never comes is seen."""
    missing = next((k for k in ids if k not in run.client.streams_with_tokens), None)
    waiting = None if missing is None else f"s{missing:02d}"
    if waiting is not None and waiting != run.waiting_for:
        log.info("warm-up waiting for stream %s's first token", waiting)
    run.waiting_for = waiting


def _warmup_gave_up(run: _Run, ids: list[int], waited_s: float) -> None:
    """The warm-up's limit passed with streams still without a token: measure anyway, and say so."""
    missing = [f"s{k:02d}" for k in ids if k not in run.client.streams_with_tokens]
    run.warmup_timeout = {"waited_s": round(waited_s, 3), "streams_without_token": missing}
    log.warning("warm-up gave up after %.0f s waiting for the first token of stream(s) %s; measuring anyway",
                waited_s, ", ".join(missing))


async def _watch(event: asyncio.Event, run: _Run) -> None:
    await event.wait()
    run.stop("stop_event")


def _pause_writer(sink: RowSink, observer: DriveObserver | None) -> Callable[[dict[str, object]], None]:
    if observer is None:
        return lambda row: sink.add("client_pauses", row)

    def write(row: dict[str, object]) -> None:
        sink.add("client_pauses", row)
        observer.on_pause(row)

    return write


def _split_feed(feed: Iterator[_T]) -> Iterator[_T] | None:
    first = next(feed, None)
    return None if first is None else itertools.chain([first], feed)


def _check(duration_s: float, warmup_s: float, drain_timeout_s: float, max_connection_errors: int) -> None:
    check_load_shape(None, None, 1.0, duration_s)
    if warmup_s < 0 or drain_timeout_s < 0:
        raise ConfigError("warmup_s/drain_timeout_s", "must be >= 0")
    if max_connection_errors < 1:
        raise ConfigError("max_connection_errors", "must be >= 1")


async def drive(plan: LoadPlan, target: Target, store: RunStore, *, duration_s: float, warmup_s: float = 0.0,
                drain_timeout_s: float = 30.0, on_progress: Callable[[ProgressSnapshot], None] | None = None,
                stop_event: asyncio.Event | None = None, max_connection_errors: int = 50,
                sample_interval_s: float = 0.5, handle_sigint: bool = True, warmup: Warmup | None = None,
                shard: Shard | None = None, observer: DriveObserver | None = None,
                before_measure: Hook | None = None, after_measure: Hook | None = None) -> DriveResult:
    """Run `plan` against `target`, writing requests, chunks and client samples into `store`.

    Returns after the drain; a cancelled drive cancels its requests, flushes every record, re-raises.
    Ctrl-C stops the run cleanly unless the caller passes `stop_event` (then it owns the signal).
    `shard` makes this one of several client processes (one start instant, one measurement window,
    run-wide stream indices; a plan's own `stream` wins).
    `observer` (live telemetry) sees every request, chunk, client sample and client pause.
    `before_measure` is awaited when the warmup is over and the window opens after it returns;
    `after_measure` starts when sending stops and runs beside the drain (both: /metrics scrapes).
    """
    _check(duration_s, warmup.min_s if warmup else warmup_s, drain_timeout_s, max_connection_errors)
    streams = [iter(s) for s in plan.streams]
    feed = _split_feed(iter(plan.open_loop))
    sessions = _split_feed(iter(plan.sessions))
    sink = RowSink(store)
    unlimited = feed is not None or sessions is not None
    client = make_stream_client(target, sink, limit=0 if unlimited else max(1, len(streams)), observer=observer)
    run = _Run(client, max_connection_errors)
    monitor = ClientMonitor(sample_interval_s)
    with frozen_heap():
        return await _drive(run, client, sink, monitor, streams, feed, sessions, duration_s=duration_s,
                            warmup=warmup or Warmup(min_s=warmup_s),
                            drain_timeout_s=drain_timeout_s, on_progress=on_progress, stop_event=stop_event,
                            handle_sigint=handle_sigint, shard=shard, observer=observer,
                            before_measure=before_measure, after_measure=after_measure)


async def _drive(run: _Run, client: StreamClient, sink: RowSink, monitor: ClientMonitor,
                 streams: list[Iterator[RequestPlan]], feed: Iterator[RequestPlan] | None,
                 sessions: Iterator[SessionPlan] | None, *, duration_s: float,
                 warmup: Warmup, drain_timeout_s: float, on_progress: Callable[[ProgressSnapshot], None] | None,
                 stop_event: asyncio.Event | None, handle_sigint: bool, shard: Shard | None,
                 observer: DriveObserver | None, before_measure: Hook | None = None,
                 after_measure: Hook | None = None) -> DriveResult:
    async with client:
        if shard is not None:
            await asyncio.sleep(max(0.0, (shard.start_at_ns - _now()) / 1e9))
        run_start = _now()
        run.duration_s = duration_s
        ids = list(shard.stream_ids) if shard is not None else list(range(len(streams)))
        total = shard.total_streams if shard is not None else len(streams)
        ramp_ns = int(warmup.ramp_s * 1e9)
        workers = {asyncio.create_task(_closed_stream(run, k, it, run_start + ramp_ns * k // max(1, total)))
                   for k, it in zip(ids, streams, strict=True)}
        if feed is not None:
            workers.add(asyncio.create_task(_open_loop(run, feed)))
        if sessions is not None:
            workers.add(asyncio.create_task(_arriving_sessions(run, sessions)))
        # kernel stamps do not move with the client's pauses and each chunk row carries its read delay,
        # so the watchdog can tick slower there: its 5 ms wake-ups alone cost 2 % of a core here
        watchdog = PauseWatchdog(_pause_writer(sink, observer),
                                 tick_s=KERNEL_WATCHDOG_TICK_S if client.stamp_source_name() == "kernel" else 0.005)
        helpers = [asyncio.create_task(_sample(run, monitor, sink, run_start, on_progress,
                                               observer.on_sample if observer is not None else None)),
                   asyncio.create_task(watchdog.run())]
        if stop_event is not None:
            helpers.append(asyncio.create_task(_watch(stop_event, run)))
        restore = install_sigint(run.stop) if handle_sigint and stop_event is None else (lambda: None)
        send_end = sys.maxsize
        closing: list[asyncio.Task[object]] = []  # after_measure, running beside the drain
        try:
            await _warm_up(run, run_start, warmup, len(streams), shard, before_measure)
            await run.pause((run.end_ns - _now()) / 1e9)
            send_end = min(_now(), run.end_ns)
            run.closed.set()
            if after_measure is not None:
                closing.append(asyncio.ensure_future(after_measure()))
            await finish(workers | set(run.requests), 0.0 if run.stop_reason else drain_timeout_s)
            await asyncio.gather(*closing, return_exceptions=True)
        except asyncio.CancelledError:
            run.stop("cancelled")
            await finish(workers | set(run.requests), 0.0)
            raise
        finally:
            restore()
            for h in (*helpers, *closing):
                h.cancel()
            await asyncio.gather(*helpers, *closing, return_exceptions=True)
            await sink.aclose()
    if run.aborted_reason is None and run.stop_reason is None:
        run.aborted_reason = run.measured_nothing_after_warmup_timeout()
    stats = monitor.stats(run.send_lags)
    stats.dropped_rows = dict(sink.dropped)
    stats.stream_reader = client.stamp_source_name()
    stats.kernel_clock = client.clock_report()
    reason = run.stop_reason or ("aborted" if run.aborted_reason else "completed")
    measure_start = run.measure_start_ns if run.measure_start_ns is not None else run_start
    send_end = min(send_end, _now())
    return DriveResult(run_start, measure_start, send_end, _now(), dict(run.counts), reason,
                       run.aborted_reason, run.open_loop_truncated, stats, run.backoff.doc(), run.warmup_timeout)
