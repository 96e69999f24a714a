"""Drive one run's load with its observers beside it: the engine's step log, /metrics scrapes, and Ctrl-C or
SIGTERM ending the run cleanly; in this process, or in others (Locust, or `--workers N`).

Split from `orchestrate`, which sets the run up and writes its records: this is the part that runs while the
load is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from itlbench.harness.connect import Connection
from itlbench.harness.run_config import RunConfig
from itlbench.harness.step_catchup import start_step, until_caught_up
from itlbench.load.driver import DriveResult, ProgressSnapshot, Warmup, drive
from itlbench.load.multiproc import drive_workers
from itlbench.load.observers.metrics_sampler import MetricsSampler
from itlbench.load.observers.steps_follower import StepsFollower
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.workloads.build import LoadSpec, build_load_plan
from itlbench.workloads.plan import LoadPlan

if TYPE_CHECKING:
    from itlbench.telemetry.observer import LiveTelemetry
    from itlbench.workloads.trace import Trace

ProgressFn = Callable[[ProgressSnapshot], None]


@dataclass
class _Observers:
    """Server-side records next to the load: the step log of an itlbench engine; periodic /metrics
    scrapes of others only when asked (`--scrape-interval`)."""

    steps: StepsFollower | None
    tasks: list[asyncio.Task[None]]

    @classmethod
    async def start(cls, conn: Connection, store: RunStore, sampler: MetricsSampler | None,
                    telemetry: LiveTelemetry | None = None, api_key: str | None = None) -> _Observers:
        """Begin following at the engine's next step: the steps of its earlier runs are not this run's."""
        writer = telemetry.tee(store) if telemetry is not None else store  # live stall causes
        steps = StepsFollower(conn.steps_url, writer) if conn.steps_url else None
        if steps is not None and conn.steps_url is not None:
            steps.next_step = await start_step(conn.steps_url, api_key)
        tasks = [asyncio.create_task(steps.run())] if steps else []
        if sampler is not None and sampler.interval_s > 0:
            tasks.append(asyncio.create_task(sampler.run_periodic()))
        return cls(steps, tasks)

    async def stop(self, engine_url: str | None, api_key: str | None, timeout_s: float = 10.0) -> None:
        """Cancel the observers once the step follower holds the engine's last step (or it is gone)."""
        if self.steps is not None and engine_url is not None:
            await until_caught_up(self.steps, engine_url, api_key, timeout_s)
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def drive_with_observers(cfg: RunConfig, spec: LoadSpec, plan: LoadPlan, conn: Connection, store: RunStore,
                               progress: ProgressFn | None, telemetry: LiveTelemetry | None = None,
                               on_status: Callable[[str], None] = lambda s: None,
                               driver_doc: dict[str, Any] | None = None,
                               notes: dict[str, Any] | None = None, trace: Trace | None = None) -> DriveResult:
    """Drive the load; an external engine's /metrics is read just before the window opens and as
    soon as sending stops (and every `--scrape-interval` when given). `notes` gets the scrape counts.
    `trace`: the trace `plan` replays as the run read it, handed to the processes that rebuild the plan."""
    sampler = (MetricsSampler(conn.metrics_url, store, api_key=cfg.api_key, interval_s=cfg.scrape_interval_s,
                              max_bytes=cfg.limits.metrics_bytes)
               if conn.metrics_url else None)
    async with contextlib.AsyncExitStack() as stack:
        if sampler is not None:
            await stack.enter_async_context(sampler)
        try:
            return await _drive_observed(cfg, spec, plan, conn, store, progress, sampler, telemetry, on_status,
                                         driver_doc, notes, trace)
        finally:
            if sampler is not None:
                sampler.finish()
                if notes is not None:
                    notes["metrics"] = {"url": sampler.url, "interval_s": sampler.interval_s,
                                        "scrapes": sampler.scrapes, "failures": sampler.failures,
                                        "engine_prefix": sampler.prefix}


async def _drive_observed(cfg: RunConfig, spec: LoadSpec, plan: LoadPlan, conn: Connection, store: RunStore,
                          progress: ProgressFn | None, sampler: MetricsSampler | None,
                          telemetry: LiveTelemetry | None, on_status: Callable[[str], None],
                          driver_doc: dict[str, Any] | None, notes: dict[str, Any] | None = None,
                          trace: Trace | None = None) -> DriveResult:
    """Drive `plan` (other processes rebuild it from `spec` and `trace`) with Ctrl-C and SIGTERM stopping the run cleanly;
    `notes` (run.json) gets `interrupted` and the signal's name."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_signal(signum: signal.Signals) -> None:
        nonlocal interrupts
        interrupts += 1
        if notes is not None:  # run.json says a signal ended it: the exit status is 128 + its number
            notes.setdefault("interrupted", True)
            notes.setdefault("signal", signum.name)
        stop.set()
        if interrupts > 1:
            for task in asyncio.all_tasks(loop):
                task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, on_signal, signal.SIGINT)
        loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)  # a terminated run still writes its records
    observers = await _Observers.start(conn, store, sampler, telemetry, cfg.api_key)
    target = conn.target
    warmup = Warmup(min_s=cfg.warmup_s, adaptive=cfg.adaptive_warmup, max_s=cfg.warmup_limit_s, ramp_s=cfg.ramp_s)
    baseline = None if sampler is None else functools.partial(sampler.scrape, "baseline")
    final = None if sampler is None else functools.partial(sampler.scrape, "final")
    try:
        if cfg.driver == "locust" or cfg.workers > 1:
            # other processes agree the window among themselves: the reads bracket the whole run
            if baseline is not None:
                await baseline()
            result = await _drive_elsewhere(cfg, spec, plan, trace, target, store, warmup, progress, on_status,
                                            stop, driver_doc)
            if final is not None:
                await final()
            return result
        return await drive(plan, target, store, duration_s=cfg.duration_s, warmup=warmup,
                           drain_timeout_s=cfg.drain_timeout_s, on_progress=progress, stop_event=stop,
                           observer=telemetry, before_measure=baseline, after_measure=final)
    finally:
        await observers.stop(conn.steps_url, cfg.api_key)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)


async def _drive_elsewhere(cfg: RunConfig, spec: LoadSpec, plan: LoadPlan, trace: Trace | None, target: Target,
                           store: RunStore, warmup: Warmup, progress: ProgressFn | None,
                           on_status: Callable[[str], None], stop: asyncio.Event,
                           driver_doc: dict[str, Any] | None) -> DriveResult:
    """The load from other processes: Locust, or several itlbench workers. Each rebuilds the same seeded plan
    from `spec` and takes its share; a replayed trace is the one this process read, not read again there
    (Locust workers started by hand elsewhere read their own)."""
    if cfg.driver == "locust":  # master and workers in their own processes (never import locust here)
        from itlbench.harness.locust_run import drive_locust, job_for_run

        job = job_for_run(cfg, spec, target, store.path, streams=len(plan.streams))
        return await drive_locust(job, store, on_progress=progress, on_status=on_status, stop_event=stop,
                                  driver_doc=driver_doc, trace=trace)
    # the parsed trace goes with the factory (pickled to each spawned worker: a few arrays, no parsing there)
    return await drive_workers(functools.partial(build_load_plan, spec, trace=trace), target, store,
                               workers=cfg.workers, duration_s=cfg.duration_s, warmup=warmup,
                               drain_timeout_s=cfg.drain_timeout_s, on_progress=progress, stop_event=stop)
