"""`itlbench` command line: run, serve, analyze, workloads."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlbench.engine.config import EngineConfig, default_preset, parse_chunk_budget
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.units import parse_duration_s

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Measure what long prompts do to streaming LLM latency: TTFT by prompt bucket, "
                       "ITL tails, stalls and their cause, prefill:decode split.")
console = Console(stderr=True)

# Engine flags, declared once and shared by `run` (bundled engine) and `serve`.
Model = Annotated[str | None, typer.Option(help="Preset (cpu-small, llama-3.1-8b, …) or local Hugging Face directory "
                                           "(default: llama-3.2-1b on CUDA, cpu-small on CPU).")]
ChunkBudget = Annotated[str, typer.Option("--chunk-budget", help="Tokens per engine step (2048, 8k; k = 1024), "
                                          "or 'none' (unchunked prefill).")]
Policy = Annotated[str, typer.Option("--policy", help="budget (vLLM V1 token budget) or prefill-first (SGLang).")]
Mixed = Annotated[bool, typer.Option(help="prefill-first only: decodes ride in prefill steps.")]
MaxNumSeqs = Annotated[int, typer.Option(help="Cap on running sequences.")]
BlockSize = Annotated[int, typer.Option(help="Tokens per KV-cache block.")]
KvBlocks = Annotated[int | None, typer.Option(help="KV-cache blocks (default: sized from --kv-memory-gib).")]
KvMemoryGib = Annotated[float | None, typer.Option(help="KV-cache memory when --kv-blocks is not given (default: "
                                                   "4 GiB on CPU; on CUDA --gpu-memory-fraction of free memory).")]
GpuMemoryFraction = Annotated[float, typer.Option(help="CUDA: share of free memory after the weights for KV and "
                                                  "activations, when neither --kv-blocks nor --kv-memory-gib is given.")]
Attention = Annotated[str, typer.Option(help="Attention kernels: auto (flash, triton, then sdpa, whichever runs "
                                        "here), sdpa, flash or triton.")]
CudaGraphs = Annotated[bool, typer.Option(help="CUDA: replay captured graphs for decode-only steps.")]
MaxModelLen = Annotated[int | None, typer.Option(help="Context limit (default: the model's).")]
PrefixCaching = Annotated[bool, typer.Option(help="Reuse KV blocks of identical prompt prefixes.")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
Dtype = Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16 or float16.")]
Seed = Annotated[int, typer.Option(help="Seed for lengths, arrivals, prompts and the engine.")]
OtlpEndpoint = Annotated[str | None, typer.Option(help="Export OpenTelemetry spans and GenAI metrics over OTLP/HTTP "
                                                  "to this base URL (e.g. http://127.0.0.1:4318).")]

_RENAMED_FLAGS = {"enable_prefix_caching": "--no-prefix-caching"}


def _flag_of(field: str) -> str:
    """The flag a user typed for an EngineConfig field (errors name what the user can change)."""
    return _RENAMED_FLAGS.get(field, "--" + field.replace("_", "-"))


def _fail(exc: Exception) -> None:
    if isinstance(exc, ConfigError) and exc.field in {f.name for f in fields(EngineConfig)}:
        exc = ConfigError(_flag_of(exc.field), exc.problem, exc.fix)
    console.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)


def _engine_config(*, model: str | None, chunk_budget: str, device: str, **flags: object) -> EngineConfig:
    """An EngineConfig from the engine flags (names match its fields)."""
    return EngineConfig(model=model or default_preset(device), chunk_budget=parse_chunk_budget(chunk_budget),
                        device=device, **flags)  # type: ignore[arg-type]


@app.command()
def run(
    workload: Annotated[str, typer.Option(help="chat-short, chat, rag, summarization, code, agent or trace.")] = "chat",
    inject: Annotated[str | None, typer.Option(help="Long prompts to inject: 32k, 32k@20s, 2x16k@10s,40s, 32k/30s.")] = None,
    streams: Annotated[int | None, typer.Option(help="Closed-loop steady streams (default 32; 0 with --rate or trace).")] = None,
    rate: Annotated[float | None, typer.Option(help="Open-loop arrivals per second (instead of or besides streams).")] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape for --rate arrivals; 1 = Poisson.")] = 1.0,
    duration: Annotated[str, typer.Option(help="Measured time after warmup: 60, 60s, 2m.")] = "60s",
    warmup: Annotated[str, typer.Option(help="Load at least this long before measurement starts.")] = "5s",
    adaptive_warmup: Annotated[bool, typer.Option(help="Also warm up until every stream has received a token.")] = True,
    ramp: Annotated[str, typer.Option(help="Spread the streams' first sends over this long.")] = "0s",
    seed: Seed = 0,
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1); default: start the bundled engine.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name (with --endpoint), or the bundled engine's preset / "
                                              "HF dir (default: llama-3.2-1b on CUDA, cpu-small on CPU).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Bearer key for --endpoint.")] = None,
    api: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    forced_lengths: Annotated[bool, typer.Option(help="Send ignore_eos and min_tokens (vLLM, SGLang, itlbench accept "
                                                      "them) so every request generates exactly its max_tokens.")] = True,
    chunk_budget: ChunkBudget = "2048",
    policy: Policy = "budget",
    mixed: Mixed = False,
    max_num_seqs: MaxNumSeqs = 64,
    block_size: BlockSize = 16,
    kv_blocks: KvBlocks = None,
    kv_memory_gib: KvMemoryGib = None,
    gpu_memory_fraction: GpuMemoryFraction = 0.9,
    max_model_len: MaxModelLen = None,
    prefix_caching: PrefixCaching = True,
    device: Device = "auto",
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    cuda_graphs: CudaGraphs = True,
    slo: Annotated[str | None, typer.Option(help="SLOs, e.g. 'ttft:le2k=2s,itl_p99=150ms'.")] = None,
    stall_factor: Annotated[float, typer.Option(help="A stall is a gap ≥ factor × the stream's median gap…")] = 5.0,
    stall_floor: Annotated[str, typer.Option(help="…and at least this long.")] = "50ms",
    inject_max_tokens: Annotated[int, typer.Option(help="Output tokens of each injected request.")] = 16,
    trace: Annotated[Path | None, typer.Option(help="Azure-format CSV for --workload trace.")] = None,
    time_scale: Annotated[float, typer.Option(help="Trace replay speed-up (2 = twice as fast).")] = 1.0,
    drain_timeout: Annotated[str, typer.Option(help="How long in-flight requests may finish after the end.")] = "120s",
    out: Annotated[Path | None, typer.Option(help="Run directory (default reports/<time>-<workload>-…).")] = None,
    workers: Annotated[int, typer.Option(help="Client processes for very high stream counts.")] = 1,
    live: Annotated[bool, typer.Option(help="Show the live progress line.")] = True,
    stream_reader: Annotated[str, typer.Option(help="auto, kernel (kernel receive timestamps; plain http on Linux) "
                                                    "or aiohttp (user-space timestamps).")] = "auto",
    metrics_port: Annotated[str | None, typer.Option(help="Serve live itlbench_client_* metrics for Prometheus on "
                                                          "this port (PORT or HOST:PORT; loopback by default).")] = None,
    otlp_endpoint: OtlpEndpoint = None,
) -> None:
    """Drive a workload (and injected long prompts) against the bundled engine or --endpoint."""
    from itlbench.report.terminal import LiveProgress, print_summary
    from itlbench.run_config import RunConfig

    try:
        engine = _engine_config(model=None if endpoint else model, chunk_budget=chunk_budget, policy=policy,
                                mixed=mixed, max_num_seqs=max_num_seqs, block_size=block_size, kv_blocks=kv_blocks,
                                kv_memory_gib=kv_memory_gib, gpu_memory_fraction=gpu_memory_fraction,
                                attention=attention, cuda_graphs=cuda_graphs, max_model_len=max_model_len,
                                enable_prefix_caching=prefix_caching, device=device, dtype=dtype, seed=seed)
        cfg = RunConfig(workload=workload, inject=inject, inject_max_tokens=inject_max_tokens, streams=streams,
                        rate=rate, burstiness=burstiness, duration_s=parse_duration_s(duration, "--duration"),
                        warmup_s=parse_duration_s(warmup, "--warmup"), seed=seed,
                        adaptive_warmup=adaptive_warmup, ramp_s=parse_duration_s(ramp, "--ramp"),
                        endpoint=endpoint, model=model, api_key=api_key, api=api, engine=engine, slo=slo,
                        forced_lengths=forced_lengths,
                        stall_factor=stall_factor, stall_floor_s=parse_duration_s(stall_floor, "--stall-floor"),
                        trace=trace, time_scale=time_scale,
                        drain_timeout_s=parse_duration_s(drain_timeout, "--drain-timeout"), out=out,
                        workers=workers, live=live, metrics_port=metrics_port, otlp_endpoint=otlp_endpoint,
                        stream_reader=stream_reader)
        cfg.validate()
        from itlbench.orchestrate import run_load_test

        with LiveProgress(console, total_s=cfg.duration_s, enabled=live) as progress:
            run_dir, summary = run_load_test(cfg, progress=progress.update, on_status=progress.status)
    except ItlbenchError as exc:
        _fail(exc)
        return
    print_summary(console, summary, run_dir)
    print(run_dir)


@app.command()
def serve(
    ctx: typer.Context,
    model: Model = None,
    chunk_budget: ChunkBudget = "2048",
    policy: Policy = "budget",
    mixed: Mixed = False,
    max_num_seqs: MaxNumSeqs = 64,
    block_size: BlockSize = 16,
    kv_blocks: KvBlocks = None,
    kv_memory_gib: KvMemoryGib = None,
    gpu_memory_fraction: GpuMemoryFraction = 0.9,
    max_model_len: MaxModelLen = None,
    prefix_caching: PrefixCaching = True,
    device: Device = "auto",
    dtype: Dtype = "auto",
    attention: Attention = "auto",
    cuda_graphs: CudaGraphs = True,
    seed: Seed = 0,
    engine_config: Annotated[str | None, typer.Option(
        help="The whole engine configuration as JSON (what `itlbench run` hands its server); "
             "replaces the engine flags above.")] = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback unless told otherwise).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Require this bearer key.")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model name in the API (default: the model).")] = None,
    max_waiting: Annotated[int, typer.Option(help="Waiting requests beyond which new ones get 429.")] = 1024,
    max_body_mib: Annotated[float, typer.Option(help="Largest request body accepted (413 above).")] = 4.0,
    access_log: Annotated[bool, typer.Option(help="Log every HTTP request.")] = False,
    otlp_endpoint: OtlpEndpoint = None,
) -> None:
    """Serve the bundled engine with an OpenAI-compatible API, /metrics and /v1/steps."""
    try:
        if engine_config is not None:
            _refuse_engine_flags(ctx)
            engine = EngineConfig.from_json(engine_config)
        else:
            engine = _engine_config(model=model, chunk_budget=chunk_budget, policy=policy, mixed=mixed,
                                    max_num_seqs=max_num_seqs, block_size=block_size, kv_blocks=kv_blocks,
                                    kv_memory_gib=kv_memory_gib, gpu_memory_fraction=gpu_memory_fraction,
                                    attention=attention, cuda_graphs=cuda_graphs, max_model_len=max_model_len,
                                    enable_prefix_caching=prefix_caching, device=device, dtype=dtype, seed=seed)
        if max_body_mib <= 0:
            raise ConfigError("--max-body-mib", f"must be > 0, got {max_body_mib}")
        if otlp_endpoint is not None:
            from itlbench.telemetry.otel import check_endpoint

            otlp_endpoint = check_endpoint(otlp_endpoint)
    except ItlbenchError as exc:
        _fail(exc)
        return
    from itlbench.engine.malloc_tuning import reexec_with_malloc_tunables

    reexec_with_malloc_tunables()  # only after the flags are known good: it restarts the process
    from itlbench.server import ServerConfig
    from itlbench.server import serve as serve_forever
    from itlbench.server.main import die_with_parent

    die_with_parent()
    try:
        serve_forever(ServerConfig(engine=engine, host=host, port=port, api_key=api_key,
                                   served_model_name=served_model_name, max_waiting=max_waiting,
                                   access_log=access_log, max_body_mib=max_body_mib,
                                   otlp_endpoint=otlp_endpoint))
    except ItlbenchError as exc:
        _fail(exc)


_SERVER_FLAGS = {"engine_config", "host", "port", "api_key", "served_model_name", "max_waiting", "max_body_mib",
                 "access_log", "otlp_endpoint"}


def _refuse_engine_flags(ctx: typer.Context) -> None:
    """--engine-config is the whole engine; an engine flag beside it would be silently overridden."""
    given = [name for name in ctx.params if name not in _SERVER_FLAGS
             and getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if given:
        raise ConfigError("--engine-config", f"given together with {', '.join(_flag_of(n) for n in given)}",
                          "put every engine setting in the JSON, or drop --engine-config")


@app.command()
def analyze(run_dir: Annotated[Path, typer.Argument(help="A run directory written by `itlbench run`.")]) -> None:
    """Recompute summary.json from a run directory's records (e.g. after an interrupted run)."""
    from itlbench.analysis.summary import analyze_run
    from itlbench.report.terminal import print_summary
    from itlbench.rundir.store import RunStore

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


@app.command("export-model")
def export_model_command(
    preset: Annotated[str, typer.Argument(metavar="PRESET", help="A preset: cpu-small, cpu-medium, tiny, llama-3.2-1b, ...")],
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to write (new or empty).")],
    seed: Annotated[int, typer.Option(help="Seed of the dummy weights (the bundled engine's --seed).")] = 0,
    force: Annotated[bool, typer.Option(help="Write into a non-empty directory, replacing its files.")] = False,
) -> None:
    """Write a preset as a Hugging Face model directory (config.json, safetensors, tokenizer.json) that
    the bundled engine, transformers and vLLM all load, so the same model runs in each."""
    from itlbench.export_model import export_model

    try:
        done = export_model(preset, out, seed=seed, force=force)
    except ItlbenchError as exc:
        _fail(exc)
        return
    console.print(f"{preset}: {done.model.num_params / 1e6:.1f} M parameters, "
                  f"{done.weight_bytes / 2**20:.0f} MiB of float32 weights (seed {seed})", highlight=False)
    print(done.path)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
