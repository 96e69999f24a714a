"""`itlbench run --engine sim` on the virtual clock: the simulated engine in-process, no server.

`harness.orchestrate.run_load_test` hands a run here when `RunConfig.virtual_clock` says so (the
default for the simulator; `--clock real` serves it over HTTP in real time instead). The run is the
one the served path would measure — the same seeded load plan, engine configuration and run
directory tables — but it is driven on a discrete-event clock (`sim.virtual_drive`), so a run of
minutes of simulated time takes seconds. run.json says `clock: virtual`: every time in it is
simulated engine time, with no client, network or server process in it, and the client-side
validity checks (event-loop lag, client CPU, kernel stamps) have nothing to check.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from itlbench import __version__
from itlbench.core.engine import Engine
from itlbench.core.presets import load_model_config
from itlbench.harness.connect import Connection
from itlbench.harness.finish import finish_run_dir
from itlbench.harness.run_config import RunConfig
from itlbench.harness.run_doc import config_doc, hardware, load_spec, versions
from itlbench.load.driver import Warmup
from itlbench.load.observers.gpu_sampler import why_not_sampled
from itlbench.load.progress import ProgressSnapshot
from itlbench.rundir.store import RunStore
from itlbench.sim.accuracy import check_doc, check_line
from itlbench.sim.runner import offline_engine
from itlbench.sim.virtual_drive import VirtualDrive, VirtualLimits
from itlbench.system.stop_signals import stop_signals
from itlbench.workloads.build import build_load_plan
from itlbench.workloads.trace import Trace

CLOCK_NOTE = ("simulated time on a virtual clock: every figure is the simulated engine's, with no client, "
              "network or server in it; the client-side validity checks do not apply")
START_NS = 0  # the virtual clock's origin: run_start_ns


def engine_doc(engine: Engine, served_model_name: str, warning: str | None = None) -> dict[str, Any]:
    """What the bundled server's GET /v1/engine reports, for run.json's `engine`; `warning` joins the
    serving warnings the terminal repeats after the tables."""
    bm = engine.block_manager
    return {"served_model_name": served_model_name, "engine": engine.config.as_dict(),
            "model": dataclasses.asdict(engine.model_config), "device": str(engine.device),
            "dtype": str(engine.dtype), "max_model_len": engine.max_model_len, "kv_blocks": bm.num_blocks,
            "kv_free_blocks": bm.num_free_blocks, "kv_usage": bm.usage, "num_running": engine.num_running,
            "num_waiting": engine.num_waiting, "last_step": engine.step_log.last_step,
            "serving": {"mode": "in-process, virtual clock", "warnings": [warning] if warning else []}}


def phase_warning(plan: dict[str, Any], ramp_s: float) -> str | None:
    """Closed-loop streams of one fixed shape, all sent at once, keep their phase on the virtual clock, which
    has no jitter to spread them: their prompts land in waves for the whole run, so its TTFT carries that
    queueing (NVIDIA's NIM runs of the same command lie between in step and spread; docs/perf/sim-vs-published.md)."""
    workload = plan.get("workload") or {}
    streams = int(plan.get("streams") or 0)
    if ramp_s > 0 or streams < 2 or workload.get("sigma") != 0.0 or workload.get("sessions"):
        return None
    return (f"{streams} closed-loop streams of one fixed shape, sent at once, stay in step on the virtual clock (it "
            "has no jitter): their prompts keep arriving together, which a real server's jitter would spread, so TTFT "
            "includes that queueing; --ramp DUR spreads the first sends, --rate sends open-loop "
            "(docs/perf/sim-vs-published.md, NVIDIA's NIM runs)")


def run_virtual(cfg: RunConfig, run_dir: Path, created: bool, on_status: Callable[[str], None] = lambda s: None,
                progress: Callable[[ProgressSnapshot], None] | None = None,
                trace: Trace | None = None) -> tuple[Path, dict[str, Any]]:
    """Run `cfg` on the virtual clock into `run_dir`; returns (run directory, summary) like
    `run_load_test`. A configuration the engine refuses leaves no directory behind. `trace`: the run's
    trace as its check read it (None: read here)."""
    on_status(f"simulating {cfg.engine.model} on a virtual clock")
    model = load_model_config(cfg.engine.model)
    try:
        engine = offline_engine(cfg.engine, model, start_ns=START_NS)
    except Exception:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    runner = getattr(engine, "runner", None)  # disaggregated: two pools, no one runner
    check = None if runner is None else check_doc(runner.hardware, runner.cost_model.tp, runner.kv_share)
    if check is not None:
        on_status(runner.describe())
        on_status(check_line(check))
    conn = Connection(target=None, max_model_len=engine.max_model_len,  # type: ignore[arg-type]
                      vocab_size=model.vocab_size, steps_url=None, metrics_url=None)
    plan = build_load_plan(load_spec(cfg, conn), trace=trace)  # a fresh prompt salt unless --reuse-prompts, as served
    run_doc: dict[str, Any] = {
        "itlbench_version": __version__, "created": dt.datetime.now(dt.UTC).isoformat(),
        "config": config_doc(cfg), "hardware": hardware(), "versions": versions(),
        "stall_factor": cfg.stall_factor, "stall_floor_s": cfg.stall_floor_s, "slo": cfg.slo,
        "clock": "virtual", "clock_note": CLOCK_NOTE, "sim_check": check,
        "driver": {"name": "virtual", "workers": 1},
        "engine": engine_doc(engine, cfg.engine.model, phase_warning(plan.description, cfg.ramp_s)),
        "target": {"kind": "in-process", "base_url": None},
        "plan": plan.description, "gpu_telemetry": {"nvml": why_not_sampled(str(engine.device), external=False)},
    }
    store = RunStore(run_dir)
    limits = VirtualLimits(duration_s=cfg.duration_s, drain_timeout_s=cfg.drain_timeout_s,
                           request_timeout_s=cfg.request_timeout_s,
                           warmup=Warmup(min_s=cfg.warmup_s, adaptive=cfg.adaptive_warmup, max_s=cfg.max_warmup_s,
                                         ramp_s=cfg.ramp_s))
    drive = VirtualDrive(engine, plan, store, limits, on_progress=progress)
    wall0 = time.perf_counter()
    try:
        with stop_signals(functools.partial(_stopped_by, run_doc)):
            result = drive.run()
    finally:
        store.close()
    run_doc["simulation"] = {"wall_s": round(time.perf_counter() - wall0, 3), "steps": drive.steps,
                             "simulated_s": round((result.finished_ns - result.run_start_ns) / 1e9, 3)}
    run_doc.update(run_start_ns=result.run_start_ns, measure_start_ns=result.measure_start_ns, end_ns=result.end_ns,
                   stop_reason=result.stop_reason)
    if result.aborted_reason:
        run_doc["aborted_reason"] = result.aborted_reason
    return finish_run_dir(run_dir, store, run_doc)



def _stopped_by(run_doc: dict[str, Any], sig: signal.Signals) -> None:
    """Ctrl-C and SIGTERM end the simulation where it stands (the drive keeps what it produced) and run.json
    names the signal, as a served run's does. SIGTERM used to kill the process: parts without a run.json,
    which `itlbench analyze` refused."""
    run_doc.setdefault("signal", sig.name)
    run_doc["interrupted"] = True
    raise KeyboardInterrupt
