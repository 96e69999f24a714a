"""`itlbench` command line: run, serve, analyze, workloads."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlbench.engine.config import EngineConfig, default_preset, parse_chunk_budget
from itlbench.errors import ConfigError, ItlbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Measure what long prompts do to streaming LLM latency: TTFT by prompt bucket, "
                       "ITL tails, stalls and their cause, prefill:decode split.")
console = Console(stderr=True)

ChunkBudget = Annotated[str, typer.Option("--chunk-budget", help="Tokens per engine step, or 'none' (unchunked prefill).")]
Policy = Annotated[str, typer.Option("--policy", help="budget (vLLM V1 token budget) or prefill-first (SGLang).")]
EngineKind = Annotated[str, typer.Option("--engine", help="Bundled engine: torch (runs the model) or sim (same scheduler, "
                                         "roofline cost model on a virtual clock, no weights).")]
Gpu = Annotated[str | None, typer.Option(help="--engine sim: h100, h200, a100, l40s, rtx4090, cpu or a profile from "
                                         "`itlbench calibrate` (default h100).")]
SimTimeScale = Annotated[float, typer.Option(help="--engine sim: run this many times faster than the simulated GPU "
                                             "(every measured time shrinks by the same factor).")]
Disaggregate = Annotated[bool, typer.Option(help="--engine sim: prefill and decode on separate GPUs, K/V sent over a link.")]
PrefillGpu = Annotated[str | None, typer.Option(help="--disaggregate: the prefill pool's GPU (default: --gpu).")]
KvLinkGbps = Annotated[float, typer.Option(help="--disaggregate: prefill → decode link in Gb/s.")]


def _sim_fields(engine: str, gpu: str | None, sim_time_scale: float, disaggregate: bool, prefill_gpu: str | None,
                kv_link_gbps: float) -> dict[str, object]:
    return {"runner": engine, "gpu": gpu, "sim_time_scale": sim_time_scale, "sim_disaggregate": disaggregate,
            "sim_prefill_gpu": prefill_gpu, "sim_kv_link_gbps": kv_link_gbps}


# EngineConfig speaks in field names; users typed flags.
_FLAGS = {"chunk_budget": "--chunk-budget", "policy": "--policy", "mixed": "--mixed", "max_num_seqs": "--max-num-seqs",
          "kv_blocks": "--kv-blocks", "model": "--model", "device": "--device", "max_model_len": "--max-model-len",
          "block_size": "--block-size", "dtype": "--dtype", "runner": "--engine", "gpu": "--gpu",
          "sim_time_scale": "--sim-time-scale", "sim_disaggregate": "--disaggregate",
          "sim_prefill_gpu": "--prefill-gpu", "sim_kv_link_gbps": "--kv-link-gbps"}


def _fail(exc: Exception) -> None:
    if isinstance(exc, ConfigError) and exc.field in _FLAGS:
        exc = ConfigError(_FLAGS[exc.field], exc.problem, exc.fix)
    console.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)


def _engine_config(model: str | None, chunk_budget: str, policy: str, mixed: bool, max_num_seqs: int,
                   kv_blocks: int | None, device: str, seed: int, max_model_len: int | None = None,
                   sim: dict[str, object] | None = None) -> EngineConfig:
    return EngineConfig(model=model or default_preset(device), chunk_budget=parse_chunk_budget(chunk_budget),
                        policy=policy, mixed=mixed, max_num_seqs=max_num_seqs, kv_blocks=kv_blocks,
                        device=device, seed=seed, max_model_len=max_model_len, **(sim or {}))  # type: ignore[arg-type]


@app.command()
def run(
    workload: Annotated[str, typer.Option(help="chat-short, chat, rag, summarization, code, agent or trace.")] = "chat",
    inject: Annotated[str | None, typer.Option(help="Long prompts to inject: 32k, 32k@20s, 2x16k@10s,40s, 32k/30s.")] = None,
    streams: Annotated[int | None, typer.Option(help="Closed-loop steady streams (default 32; 0 with --rate or trace).")] = None,
    rate: Annotated[float | None, typer.Option(help="Open-loop arrivals per second (instead of or besides streams).")] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape for --rate arrivals; 1 = Poisson.")] = 1.0,
    duration: Annotated[float, typer.Option(help="Measured seconds (after warmup).")] = 60.0,
    warmup: Annotated[float, typer.Option(help="Seconds of load at least before measurement starts.")] = 5.0,
    adaptive_warmup: Annotated[bool, typer.Option(help="Also warm up until every stream has received a token.")] = True,
    ramp: Annotated[float, typer.Option(help="Spread the streams' first sends over this many seconds.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for lengths, arrivals, prompts and the engine.")] = 0,
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1); default: start the bundled engine.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name (with --endpoint), or the bundled engine's preset / "
                                              "HF dir (default: llama-3.2-1b on CUDA, cpu-small on CPU).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Bearer key for --endpoint.")] = None,
    api: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    forced_lengths: Annotated[bool, typer.Option(help="Send ignore_eos and min_tokens (vLLM, SGLang, itlbench accept "
                                                      "them) so every request generates exactly its max_tokens.")] = True,
    chunk_budget: ChunkBudget = "2048",
    policy: Policy = "budget",
    mixed: Annotated[bool, typer.Option(help="prefill-first only: decodes ride in prefill steps.")] = False,
    max_num_seqs: Annotated[int, typer.Option(help="Bundled engine: cap on running sequences.")] = 64,
    kv_blocks: Annotated[int | None, typer.Option(help="Bundled engine: KV blocks (default: sized from memory).")] = None,
    device: Annotated[str, typer.Option(help="Bundled engine: auto, cpu or cuda.")] = "auto",
    max_model_len: Annotated[int | None, typer.Option(help="Bundled engine: context limit (default: the model's).")] = None,
    engine_kind: EngineKind = "torch",
    gpu: Gpu = None,
    sim_time_scale: SimTimeScale = 1.0,
    disaggregate: Disaggregate = False,
    prefill_gpu: PrefillGpu = None,
    kv_link_gbps: KvLinkGbps = 400.0,
    slo: Annotated[str | None, typer.Option(help="SLOs, e.g. 'ttft:le2k=2s,itl_p99=150ms'.")] = None,
    stall_factor: Annotated[float, typer.Option(help="A stall is a gap ≥ factor × the stream's median gap…")] = 5.0,
    stall_floor: Annotated[float, typer.Option(help="…and ≥ this many seconds.")] = 0.05,
    inject_max_tokens: Annotated[int, typer.Option(help="Output tokens of each injected request.")] = 16,
    trace: Annotated[Path | None, typer.Option(help="Azure-format CSV for --workload trace.")] = None,
    time_scale: Annotated[float, typer.Option(help="Trace replay speed-up (2 = twice as fast).")] = 1.0,
    drain_timeout: Annotated[float, typer.Option(help="Seconds to let in-flight requests finish after the end.")] = 120.0,
    out: Annotated[Path | None, typer.Option(help="Run directory (default reports/<time>-<workload>-…).")] = None,
    workers: Annotated[int, typer.Option(help="Client processes for very high stream counts.")] = 1,
    live: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
) -> None:
    """Drive a workload (and injected long prompts) against the bundled engine or --endpoint."""
    from itlbench.report.terminal import LiveProgress, print_summary
    from itlbench.run_config import RunConfig

    try:
        sim = _sim_fields(engine_kind, gpu, sim_time_scale, disaggregate, prefill_gpu, kv_link_gbps)
        engine = _engine_config(None if endpoint else model, chunk_budget, policy, mixed, max_num_seqs,
                                kv_blocks, device, seed, max_model_len, sim)
        cfg = RunConfig(workload=workload, inject=inject, inject_max_tokens=inject_max_tokens, streams=streams,
                        rate=rate, burstiness=burstiness, duration_s=duration, warmup_s=warmup, seed=seed,
                        adaptive_warmup=adaptive_warmup, ramp_s=ramp,
                        endpoint=endpoint, model=model, api_key=api_key, api=api, engine=engine, slo=slo,
                        forced_lengths=forced_lengths,
                        stall_factor=stall_factor, stall_floor_s=stall_floor, trace=trace, time_scale=time_scale,
                        drain_timeout_s=drain_timeout, out=out, workers=workers, live=live)
        cfg.validate()
        from itlbench.orchestrate import run_load_test

        with LiveProgress(console, total_s=duration, enabled=live) as progress:
            run_dir, summary = run_load_test(cfg, progress=progress.update, on_status=progress.status)
    except ItlbenchError as exc:
        _fail(exc)
        return
    print_summary(console, summary, run_dir)
    if engine.runner == "sim" and engine.sim_time_scale != 1:
        console.print(f"[yellow]simulated at {engine.sim_time_scale:g}× speed: every time above is 1/"
                      f"{engine.sim_time_scale:g} of the simulated GPU's[/]", highlight=False)
    print(run_dir)


@app.command()
def serve(
    model: Annotated[str | None, typer.Option(help="Preset (cpu-small, llama-3.1-8b, …) or local HF directory "
                                              "(default: llama-3.2-1b on CUDA, cpu-small on CPU).")] = None,
    chunk_budget: ChunkBudget = "2048",
    policy: Policy = "budget",
    mixed: Annotated[bool, typer.Option(help="prefill-first only: decodes ride in prefill steps.")] = False,
    max_num_seqs: Annotated[int, typer.Option()] = 64,
    kv_blocks: Annotated[int | None, typer.Option()] = None,
    max_model_len: Annotated[int | None, typer.Option()] = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback unless told otherwise).")] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY")] = None,
    device: Annotated[str, typer.Option()] = "auto",
    seed: Annotated[int, typer.Option()] = 0,
    engine_kind: EngineKind = "torch",
    gpu: Gpu = None,
    sim_time_scale: SimTimeScale = 1.0,
    disaggregate: Disaggregate = False,
    prefill_gpu: PrefillGpu = None,
    kv_link_gbps: KvLinkGbps = 400.0,
) -> None:
    """Serve the bundled engine with an OpenAI-compatible API, /metrics and /v1/steps."""
    from itlbench.engine.malloc_tuning import reexec_with_malloc_tunables

    reexec_with_malloc_tunables()
    from itlbench.server import ServerConfig
    from itlbench.server import serve as serve_forever

    try:
        sim = _sim_fields(engine_kind, gpu, sim_time_scale, disaggregate, prefill_gpu, kv_link_gbps)
        engine = _engine_config(model, chunk_budget, policy, mixed, max_num_seqs, kv_blocks, device, seed,
                                max_model_len, sim)
        serve_forever(ServerConfig(engine=engine, host=host, port=port, api_key=api_key))
    except ItlbenchError as exc:
        _fail(exc)


@app.command()
def analyze(run_dir: Annotated[Path, typer.Argument(help="A run directory written by `itlbench run`.")]) -> None:
    """Recompute summary.json from a run directory's records (e.g. after an interrupted run)."""
    from itlbench.analysis.summary import analyze_run
    from itlbench.report.terminal import print_summary
    from itlbench.store import RunStore

    if not (run_dir / "run.json").is_file():
        _fail(ItlbenchError(f"{run_dir} has no run.json: not a run directory"))
    try:
        summary = analyze_run(run_dir)
    except ItlbenchError as exc:
        _fail(exc)
        return
    RunStore(run_dir).write_json("summary.json", summary)
    print_summary(console, summary, run_dir)
    print(run_dir)


@app.command()
def workloads(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the workload catalog with its prompt and output lengths."""
    from itlbench.report.terminal import print_catalog
    from itlbench.workloads import catalog_table

    keys = ("name", "mean_in", "mean_out", "in_out", "notes")
    rows = [dict(zip(keys, row, strict=True)) for row in catalog_table()]
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print_catalog(Console(), rows)


@app.command()
def calibrate(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories of the bundled (real) engine.")],
    out: Annotated[Path, typer.Option(help="Where to write the hardware profile (JSON, for --gpu).")] = Path("calibrated.json"),
    name: Annotated[str, typer.Option(help="Profile name shown in reports.")] = "calibrated",
    base: Annotated[str | None, typer.Option(help="Roofs the efficiencies are relative to: cpu (measured now), "
                                             "h100, … (default: cpu for CPU runs, else h100).")] = None,
    holdout: Annotated[float, typer.Option(help="Share of steps held out to report prediction error.")] = 0.25,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile and errors as JSON.")] = False,
) -> None:
    """Fit the simulator's efficiencies and per-step overhead to real step logs; save a --gpu profile."""
    from itlbench.calibrate import calibrate as fit
    from itlbench.engine.roofline import load_hardware

    try:
        if not 0 < holdout < 1:
            raise ConfigError("--holdout", f"must be between 0 and 1, got {holdout}")
        result = fit(run_dirs, base=load_hardware(base) if base else None, holdout=holdout, seed=seed, name=name)
        out.parent.mkdir(parents=True, exist_ok=True)
        result.profile.save(out)
    except ItlbenchError as exc:
        _fail(exc)
        return
    if as_json:
        json.dump(_finite(result.to_dict() | {"profile_path": str(out)}), sys.stdout, indent=2)
        print()
        return
    from itlbench.report.roofline import print_calibration

    print_calibration(Console(), result, out)


def _token_list(text: str, flag: str) -> list[int]:
    from itlbench.engine.config import parse_chunk_budget

    try:
        values = [parse_chunk_budget(part) for part in text.split(",") if part.strip()]
    except ConfigError as exc:
        raise ConfigError(flag, exc.problem, "give token counts such as 2048,32k") from None
    if not values or any(v is None for v in values):
        raise ConfigError(flag, f"cannot read {text!r}", "give token counts such as 2048,32k")
    return [int(v) for v in values if v is not None]


@app.command()
def roofline(
    model: Annotated[str, typer.Option(help="Preset, local HF directory or config.json of a Llama-like model.")] = "llama-3-8b",
    gpu: Annotated[str, typer.Option(help="h100, h200, a100, l40s, rtx4090, cpu (measured now) or a profile JSON.")] = "h100",
    compare: Annotated[str, typer.Option(help="GPUs for the side-by-side table, comma-separated, or 'none'.")] = "h100,h200,a100,l40s,rtx4090",
    prompt: Annotated[str, typer.Option(help="Prefill lengths to tabulate (k = 1024 tokens).")] = "2k,32k",
    batch: Annotated[str, typer.Option(help="Decode batch sizes to tabulate.")] = "1,32",
    context: Annotated[str, typer.Option(help="Cached context of each decoding sequence.")] = "2k",
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON (SI units).")] = False,
) -> None:
    """Roofline tables: GEMM and step intensity, prefill vs decode cost, ITL floor, crossover, GPUs side by side."""
    from itlbench.engine.config import load_model_config
    from itlbench.engine.roofline import load_hardware
    from itlbench.report.roofline import print_roofline, roofline_doc

    try:
        model_cfg = load_model_config(model)
        hw = load_hardware(gpu)
        others = [] if compare.strip().lower() == "none" else [load_hardware(g) for g in compare.split(",") if g.strip()]
        ctx = _token_list(context, "--context")
        if len(ctx) != 1:
            raise ConfigError("--context", f"takes one length, got {context!r}", "e.g. --context 2k")
        doc = roofline_doc(model_cfg, hw, others, _token_list(prompt, "--prompt"), _token_list(batch, "--batch"), ctx[0])
    except ItlbenchError as exc:
        _fail(exc)
        return
    if as_json:
        json.dump(_finite(doc), sys.stdout, indent=2)
        print()
        return
    print_roofline(Console(), doc)


def _finite(value: object) -> object:
    """JSON has no infinity: a ridge never reached becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
