"""One load test end to end: engine (bundled or external) → plan → drive → records → summary.

Whatever happens — Ctrl-C, a dead server, a timeout — the records collected so far are flushed
and the summary is computed from them, so no run is ever lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itlbench import __version__
from itlbench.analysis.goodput import parse_slo
from itlbench.core.engine_config import EngineConfig
from itlbench.core.hf_config import require_engine_family
from itlbench.core.presets import load_model_config
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.harness.connect import DEFAULT_EXTERNAL_CONTEXT, Connection, connect
from itlbench.harness.drive_load import ProgressFn, drive_with_observers
from itlbench.harness.finish import finish_run_dir
from itlbench.harness.run_config import CheckedRun, RunConfig
from itlbench.harness.run_doc import config_doc, hardware, load_spec, versions
from itlbench.load.driver import DriveResult
from itlbench.load.observers.gpu_sampler import GpuSampler, nvml_index, why_not_sampled
from itlbench.rundir.outdir import make_dir
from itlbench.rundir.store import RunStore
from itlbench.workloads.build import build_load_plan, check_without_context, read_trace
from itlbench.workloads.catalog import get_workload

if TYPE_CHECKING:
    from itlbench.telemetry.observer import LiveTelemetry
    from itlbench.workloads.trace import Trace


def default_run_dir(cfg: RunConfig) -> Path:
    """reports/<UTC time>-<workload>[-inj<spec>]-<budget> — sortable and self-describing."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    parts = [stamp, re.sub(r"[^0-9a-zA-Z-]+", "_", cfg.workload)]  # fixed:IN:OUT → fixed_IN_OUT
    if cfg.inject:
        parts.append("inj" + re.sub(r"[^0-9a-zA-Z]+", "_", cfg.inject))
    if cfg.endpoint is None:
        budget = cfg.engine.chunk_budget
        parts.append(f"b{budget}" if budget else "unchunked")
        if cfg.engine.policy != "budget":
            parts.append(cfg.engine.policy + ("-mixed" if cfg.engine.mixed else ""))
    else:
        parts.append("ext")
    return cfg.reports_dir / "-".join(parts)


def _require_empty(run_dir: Path) -> None:
    """--out must be new or empty: a run never mixes its records with other files (and says what is there)."""
    if not run_dir.is_dir():
        return
    held = sorted(p.name for p in run_dir.iterdir())
    if not held:
        return
    what = "a run" if "run.json" in held else "files (" + ", ".join(held[:3]) + (", ..." if len(held) > 3 else "") + ")"
    raise ConfigError("--out", f"{run_dir} already holds {what}", "choose a new or empty directory")


def check_run(cfg: RunConfig) -> CheckedRun:
    """Refuse bad input before anything is started, sent or printed (a command calls it before its own status
    lines: the OTLP receiver's, the live progress); returns the run directory to make and the trace read."""
    cfg.validate()
    trace = _preflight(cfg)
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--out", f"{run_dir} is a file, not a directory", "name a new or empty directory")
    _require_empty(run_dir)
    return CheckedRun(run_dir, trace)


def run_load_test(cfg: RunConfig, progress: ProgressFn | None = None,
                  on_status: Callable[[str], None] = lambda s: None,
                  checked: CheckedRun | None = None) -> tuple[Path, dict[str, Any]]:
    """Run one load test; returns (run directory, summary). Records are always flushed. `checked`: what
    `check_run(cfg)` returned (not checked twice, its trace not read twice)."""
    checked = checked or check_run(cfg)
    run_dir = checked.run_dir
    created = not run_dir.exists()  # a directory the user made stays, emptied, if nothing is measured
    make_dir(run_dir)
    if cfg.virtual_clock:  # the simulator in-process on a discrete-event clock: no server, no sleeping
        from itlbench.harness.virtual_run import run_virtual

        return run_virtual(cfg, run_dir, created, on_status, progress, checked.trace)
    telemetry = _start_telemetry(cfg)  # before the engine: a port in use fails first
    store = RunStore(run_dir)
    run_doc: dict[str, Any] = {"itlbench_version": __version__, "created": dt.datetime.now(dt.UTC).isoformat(),
                               "config": config_doc(cfg), "hardware": hardware(), "versions": versions(),
                               "stall_factor": cfg.stall_factor, "stall_floor_s": cfg.stall_floor_s, "slo": cfg.slo}
    result: DriveResult | None = None
    run_doc["driver"] = driver_doc = {"name": cfg.driver, "workers": cfg.workers}
    started_ns = time.perf_counter_ns()
    on_status(_starting(cfg))
    try:
        conn = connect(cfg, run_dir)
    except ItlbenchError:
        _discard_run_dir(run_dir, created)  # nothing was measured (the error carries the log tail)
        _close_telemetry(telemetry)
        raise
    spec = load_spec(cfg, conn)
    try:  # the plan against the server's own context length: an --inject too long for it is bad input
        plan = build_load_plan(spec, trace=checked.trace)
    except ConfigError as exc:
        conn.close()
        _discard_run_dir(run_dir, created)
        _close_telemetry(telemetry)
        raise _endpoint_fix(exc, cfg) from None
    try:
        run_doc.update(conn.doc)
        if cfg.endpoint is not None:  # the model asked for: --model, or the endpoint's only one
            run_doc["config"]["model"] = conn.target.model
        _sim_check(cfg, run_doc)
        _connect_telemetry(telemetry, cfg, conn, run_dir, run_doc)
        run_doc["plan"] = plan.description
        gpu = _start_gpu_sampler(cfg, conn, store, run_doc)  # before the provisional run.json: it says why not
        t0 = time.perf_counter_ns()  # a provisional window, kept current at every flush (a SIGKILLed run)
        measure = t0 + int(cfg.warmup_s * 1e9)
        store.keep_doc_current("run.json", run_doc, run_start_ns=t0, measure_start_ns=measure,
                               planned_end_ns=measure + int(cfg.duration_s * 1e9))
        on_status("running")
        try:
            result = asyncio.run(drive_with_observers(cfg, spec, plan, conn, store, progress, telemetry, on_status,
                                                      driver_doc, run_doc, checked.trace))
        finally:
            if gpu is not None:
                gpu.stop()
                run_doc["gpu_telemetry"] = gpu.doc()
    except (KeyboardInterrupt, asyncio.CancelledError):
        run_doc["interrupted"] = True
        run_doc.setdefault("signal", "SIGINT")
    finally:
        store.close()
        if conn.server is not None:
            run_doc["server_exit_code"] = conn.close()
        _close_telemetry(telemetry)
        run_doc.update(_window(result, started_ns, cfg))
        if result is not None:
            run_doc["stop_reason"] = _stop_reason(result, run_doc)
        if result is not None and result.aborted_reason:
            run_doc["aborted_reason"] = result.aborted_reason
        if result is not None and getattr(result, "rate_limited", None):
            run_doc["rate_limited"] = result.rate_limited
        if result is not None and getattr(result, "warmup_timeout", None):
            run_doc["warmup_timeout"] = result.warmup_timeout
        store.write_json("run.json", run_doc)  # also when the run raised: its records stay readable
    return finish_run_dir(run_dir, store, run_doc)


def _discard_run_dir(run_dir: Path, created: bool) -> None:
    """Bad input measured nothing: a directory this run made goes, one the user made stays, emptied."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for child in list(run_dir.iterdir()):
        shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)


def _endpoint_fix(exc: ConfigError, cfg: RunConfig) -> ConfigError:
    """--max-model-len sizes only the bundled engine: measuring an endpoint, the fix is the server's own setting."""
    if cfg.endpoint is None or "--max-model-len" not in exc.fix:
        return exc
    fix = exc.fix.replace("raise --max-model-len", "raise the context length the server was started with")
    return ConfigError(exc.field, exc.problem, fix)


def _stop_reason(result: DriveResult, run_doc: dict[str, Any]) -> str:
    """The drive's own reason, but `interrupted` where a signal set the stop event (not the plain `stop_event`)."""
    if run_doc.get("interrupted") and result.stop_reason == "stop_event":
        return "interrupted"
    return result.stop_reason


def _sim_check(cfg: RunConfig, run_doc: dict[str, Any]) -> None:
    """A simulated engine's error bar (sim/accuracy.py), as a virtual run records it: the bundled one's, or that of
    an endpoint that is `itlbench serve --engine sim` (its GET /v1/engine gives the profile it loaded)."""
    e = cfg.engine if cfg.endpoint is None else _served_engine_config(run_doc)
    if e is None or e.engine != "sim" or e.disaggregate:
        return
    from itlbench.sim.accuracy import config_check
    from itlbench.sim.runner import DEFAULT_GPU, sim_kv_share

    with contextlib.suppress(ItlbenchError, ValueError, KeyError):  # a profile the server refused already failed
        run_doc["sim_check"] = config_check(e.gpu or DEFAULT_GPU, e.dtype, e.tp, sim_kv_share(e))


def _served_engine_config(run_doc: dict[str, Any]) -> EngineConfig | None:
    """The engine settings an itlbench server reported in GET /v1/engine, None for other servers (or a reply
    that does not read as settings: the reply is the server's, not ours)."""
    served = ((run_doc.get("engine") or {}).get("itlbench") or {}).get("engine")
    if not isinstance(served, dict):
        return None
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    try:
        return EngineConfig(**{k: v for k, v in served.items() if k in known})
    except (TypeError, ValueError):
        return None


def _start_gpu_sampler(cfg: RunConfig, conn: Connection, store: RunStore,
                       run_doc: dict[str, Any]) -> GpuSampler | None:
    """NVML samples beside the step log when the bundled engine runs on CUDA; run.json's
    `gpu_telemetry.nvml` says 'NVML' or, starting 'no NVML', why there are none."""
    engine = conn.doc.get("engine") or {}
    device = engine.get("device") or (engine.get("itlbench") or {}).get("device")  # an itlbench endpoint's own
    why = why_not_sampled(device if isinstance(device, str) else None, external=cfg.endpoint is not None)
    if why is not None:
        run_doc["gpu_telemetry"] = {"nvml": why}
        return None
    sampler = GpuSampler(nvml_index(str(device)), sink=lambda row: store.add("gpu_samples", row)).start()
    run_doc["gpu_telemetry"] = sampler.doc()
    return sampler


def _start_telemetry(cfg: RunConfig) -> LiveTelemetry | None:
    """Live Prometheus / OpenTelemetry export, only when asked for (nothing is imported otherwise)."""
    if cfg.metrics_port is None and cfg.otlp_endpoint is None:
        return None
    from itlbench.telemetry.observer import LiveTelemetry

    return LiveTelemetry.start(cfg.metrics_port, cfg.otlp_endpoint, stall_factor=cfg.stall_factor,
                               stall_floor_s=cfg.stall_floor_s, workloads=_live_workloads(cfg))


def _connect_telemetry(telemetry: LiveTelemetry | None, cfg: RunConfig, conn: Connection, run_dir: Path,
                       run_doc: dict[str, Any]) -> None:
    if telemetry is None:
        return
    engine = conn.doc.get("engine") or {}
    engine = engine.get("itlbench", engine)  # an external itlbench server nests its /v1/engine
    ecfg = engine.get("engine") if isinstance(engine.get("engine"), dict) else None
    budget = "unknown" if ecfg is None else str(ecfg.get("chunk_budget") if ecfg.get("chunk_budget") else "none")
    info = {"run_id": run_dir.name, "workload": cfg.workload, "chunk_budget": budget,
            "policy": str(ecfg.get("policy")) if ecfg else "unknown",
            "engine": "itlbench" if ecfg else "external", "model": conn.target.model}
    telemetry.connect(conn.target, has_steps=conn.steps_url is not None,
                      provider_name="itlbench" if ecfg else "openai", run_info=info)
    run_doc["telemetry"] = telemetry.doc()


def _live_workloads(cfg: RunConfig) -> list[tuple[str, bool]]:
    """The (workload label, injected) pairs the run's requests carry (RequestPlan.workload)."""
    pairs = [(get_workload(cfg.workload).name, False)]
    return pairs + [("injected", True)] if cfg.inject else pairs


def _starting(cfg: RunConfig) -> str:
    """The status line before the server answers: which engine is started (the simulator served on a real clock
    is no bundled engine), or which endpoint is probed."""
    if cfg.endpoint is not None:
        return f"probing {cfg.endpoint}"
    if cfg.engine.engine == "sim":
        from itlbench.sim.runner import DEFAULT_GPU

        return f"starting the simulated engine ({cfg.engine.model} on {cfg.engine.gpu or DEFAULT_GPU})"
    return f"starting the bundled engine ({cfg.engine.model})"


def _close_telemetry(telemetry: LiveTelemetry | None) -> None:
    if telemetry is not None:
        telemetry.close()


# An endpoint before its probe: the checks made with it read no context length, vocabulary or target.
_UNPROBED = Connection(target=None, max_model_len=DEFAULT_EXTERNAL_CONTEXT, vocab_size=None,  # type: ignore[arg-type]
                       steps_url=None, metrics_url=None)


def _preflight(cfg: RunConfig) -> Trace | None:
    """Reject bad workload, injection and SLO flags, and a collector nobody runs, before any server starts or
    directory appears; returns the trace read (None: no trace workload)."""
    parse_slo(cfg.slo)
    if cfg.driver == "locust" and cfg.rate is not None and get_workload(cfg.workload).sessions:
        raise ConfigError("--driver", f"Locust cannot run --workload {cfg.workload} sessions arriving at --rate "
                          "(each runs its turns one after another on a stream of its own)",
                          "drop --driver locust (--workers N spreads sessions over processes), or use --streams N")
    if cfg.otlp_endpoint is not None:
        from itlbench.telemetry.otel import check_endpoint, probe_collector

        probe_collector(check_endpoint(cfg.otlp_endpoint) or cfg.otlp_endpoint)
    if cfg.endpoint is not None:  # all but the lengths, which wait for the server's context length
        return check_without_context(load_spec(cfg, _UNPROBED))
    model = load_model_config(cfg.engine.model)
    if cfg.engine.max_model_len and cfg.engine.max_model_len > model.max_position_embeddings:
        raise ConfigError("--max-model-len", f"{cfg.engine.max_model_len} exceeds {model.name}'s "
                          f"max_position_embeddings={model.max_position_embeddings}",
                          f"use at most {model.max_position_embeddings}")
    max_len = cfg.engine.max_model_len or model.max_position_embeddings
    if cfg.engine.engine != "sim":  # the simulator has no kernels to check, and may run without torch
        require_engine_family(model)  # the bundled engine computes Llama only
        if cfg.engine.attention not in ("auto", "sdpa") or cfg.engine.device not in ("auto", "cpu"):
            # only a named CUDA backend or device can be refused (auto and sdpa run wherever torch does), and
            # asking imports torch: a second or more in a client that otherwise never needs it
            from itlbench.engine.attention import preflight as attention_preflight

            attention_preflight(cfg.engine)  # e.g. --attention flash where flash-attn is missing
    conn = Connection(target=None, max_model_len=max_len, vocab_size=model.vocab_size,  # type: ignore[arg-type]
                      steps_url=None, metrics_url=None)
    spec = load_spec(cfg, conn)
    trace = read_trace(spec)
    build_load_plan(spec, trace=trace)
    return trace


def _window(result: DriveResult | None, started_ns: int, cfg: RunConfig) -> dict[str, int]:
    if result is None:
        end = time.perf_counter_ns()
        return {"run_start_ns": started_ns, "measure_start_ns": started_ns + int(cfg.warmup_s * 1e9), "end_ns": end}
    return {"run_start_ns": result.run_start_ns, "measure_start_ns": result.measure_start_ns,
            "end_ns": result.end_ns}

