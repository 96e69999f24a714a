"""`itlbench` command line: run, serve, analyze, workloads, roofline, calibrate."""

from __future__ import annotations

import json
import math
import shlex
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
Runner = Annotated[str, typer.Option("--engine", help="torch (runs the model) or sim (the same scheduler on a "
                                     "virtual clock driven by the roofline cost model; no weights, no torch).")]
Gpu = Annotated[str | None, typer.Option(help="--engine sim: h100, h200, a100, l40s, rtx4090, cpu or a profile from "
                                         "`itlbench calibrate` (default h100).")]
SimTimeScale = Annotated[float, typer.Option(help="--engine sim: run this many times faster than the simulated GPU "
                                             "(every measured time shrinks by the same factor).")]
Disaggregate = Annotated[bool, typer.Option("--disaggregate", help="--engine sim: prefill and decode on separate "
                                            "GPUs, K/V sent over a link.")]
PrefillGpu = Annotated[str | None, typer.Option("--prefill-gpu", help="--disaggregate: the prefill pool's GPU "
                                                "(default: --gpu).")]
KvLinkGbps = Annotated[float, typer.Option("--kv-link-gbps", help="--disaggregate: prefill → decode link, Gb/s.")]
EngineProcess = Annotated[bool | None, typer.Option(
    "--engine-process/--no-engine-process",
    help="Run the engine core in its own process, apart from the HTTP front end (default: yes).")]
TorchThreads = Annotated[int | None, typer.Option(
    help="Torch intra-op threads of the engine (default: the cores available to it, less one).")]
OtlpEndpoint = Annotated[str | None, typer.Option(help="Export OpenTelemetry spans and GenAI metrics over OTLP/HTTP "
                                                  "to this base URL (e.g. http://127.0.0.1:4318).")]

_RENAMED_FLAGS = {"enable_prefix_caching": "--no-prefix-caching", "runner": "--engine",
                  "sim_disaggregate": "--disaggregate", "sim_prefill_gpu": "--prefill-gpu",
                  "sim_kv_link_gbps": "--kv-link-gbps"}


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


def _check_sim(engine: EngineConfig) -> None:
    if engine.runner == "sim":
        from itlbench.engine.sim import check_sim_config

        check_sim_config(engine)


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
    prompt_format: Annotated[str, typer.Option(help="With --endpoint: ids (token-id prompts, exact lengths), text "
                                               "(calibrated words), or auto (ids when one probe request is "
                                               "accepted).")] = "auto",
    reuse_prompts: Annotated[bool, typer.Option(help="Send the same prompt text as earlier runs with this seed "
                                                "(default: a per-run salt keeps a server's prefix cache cold; "
                                                "lengths and times stay seeded).")] = False,
    scrape_interval: Annotated[str, typer.Option(help="With --endpoint: also read /metrics every S during the run "
                                                 "(default 0: only just before and just after the measured "
                                                 "window).")] = "0",
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
    runner: Runner = "torch",
    gpu: Gpu = None,
    sim_time_scale: SimTimeScale = 1.0,
    sim_disaggregate: Disaggregate = False,
    sim_prefill_gpu: PrefillGpu = None,
    sim_kv_link_gbps: KvLinkGbps = 400.0,
    engine_process: EngineProcess = None,
    torch_threads: TorchThreads = None,
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
    workers: Annotated[int, typer.Option(help="Client processes for very high stream counts (with --driver locust: "
                                               "Locust workers).")] = 1,
    driver: Annotated[str, typer.Option(help="aiohttp (one event loop per process) or locust (Locust master and "
                                             "workers; needs the locust extra).")] = "aiohttp",
    master_bind: Annotated[str | None, typer.Option(help="--driver locust: the master listens on HOST:PORT for "
                                                         "--workers workers started by hand on other machines.")] = None,
    locust_ui: Annotated[bool, typer.Option(help="--driver locust: serve Locust's web UI.")] = False,
    locust_ui_port: Annotated[int, typer.Option(help="Port of Locust's web UI (on 127.0.0.1).")] = 8089,
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
                                enable_prefix_caching=prefix_caching, device=device, dtype=dtype, seed=seed,
                                runner=runner, gpu=gpu, sim_time_scale=sim_time_scale,
                                sim_disaggregate=sim_disaggregate, sim_prefill_gpu=sim_prefill_gpu,
                                sim_kv_link_gbps=sim_kv_link_gbps,
                                engine_process=engine_process, torch_threads=torch_threads)
        _check_sim(engine)
        cfg = RunConfig(workload=workload, inject=inject, inject_max_tokens=inject_max_tokens, streams=streams,
                        rate=rate, burstiness=burstiness, duration_s=parse_duration_s(duration, "--duration"),
                        warmup_s=parse_duration_s(warmup, "--warmup"), seed=seed,
                        adaptive_warmup=adaptive_warmup, ramp_s=parse_duration_s(ramp, "--ramp"),
                        endpoint=endpoint, model=model, api_key=api_key, api=api, engine=engine, slo=slo,
                        forced_lengths=forced_lengths, prompt_format=prompt_format, reuse_prompts=reuse_prompts,
                        scrape_interval_s=parse_duration_s(scrape_interval, "--scrape-interval"),
                        stall_factor=stall_factor, stall_floor_s=parse_duration_s(stall_floor, "--stall-floor"),
                        trace=trace, time_scale=time_scale,
                        drain_timeout_s=parse_duration_s(drain_timeout, "--drain-timeout"), out=out,
                        workers=workers, live=live, metrics_port=metrics_port, otlp_endpoint=otlp_endpoint,
                        driver=driver, master_bind=master_bind, locust_ui=locust_ui, locust_ui_port=locust_ui_port,
                        stream_reader=stream_reader)
        cfg.validate()
        from itlbench.orchestrate import run_load_test

        with LiveProgress(console, total_s=cfg.duration_s, enabled=live) as progress:
            run_dir, summary = run_load_test(cfg, progress=progress.update, on_status=progress.status)
    except ItlbenchError as exc:
        _fail(exc)
        return
    print_summary(console, summary, run_dir)
    if engine.runner == "sim" and engine.sim_time_scale != 1:
        console.print(f"[yellow]simulated at {engine.sim_time_scale:g}× speed: every time above is 1/"
                      f"{engine.sim_time_scale:g} of the simulated GPU's[/]", highlight=False)
    _write_report(run_dir)
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
    runner: Runner = "torch",
    gpu: Gpu = None,
    sim_time_scale: SimTimeScale = 1.0,
    sim_disaggregate: Disaggregate = False,
    sim_prefill_gpu: PrefillGpu = None,
    sim_kv_link_gbps: KvLinkGbps = 400.0,
    engine_process: EngineProcess = None,
    torch_threads: TorchThreads = None,
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
                                    enable_prefix_caching=prefix_caching, device=device, dtype=dtype, seed=seed,
                                    runner=runner, gpu=gpu, sim_time_scale=sim_time_scale,
                                    sim_disaggregate=sim_disaggregate, sim_prefill_gpu=sim_prefill_gpu,
                                    sim_kv_link_gbps=sim_kv_link_gbps,
                                    engine_process=engine_process, torch_threads=torch_threads)
        _check_sim(engine)
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


@app.command("locust-worker")
def locust_worker(master: Annotated[str, typer.Option(help="HOST:PORT of the master (`itlbench run --driver locust "
                                                            "--master-bind ...` prints it).")]) -> None:
    """A Locust worker for `itlbench run --driver locust` on another machine; runs until the master ends."""
    import os

    from itlbench.load.locust_job import parse_host_port
    from itlbench.load.locust_run import require_locust

    try:
        parse_host_port(master, "--master")
        require_locust()
    except ItlbenchError as exc:
        _fail(exc)
        return
    # a fresh interpreter: locust must monkey-patch the process before anything else is imported
    os.execv(sys.executable, [sys.executable, "-m", "itlbench.load.locust_worker", "--master", master])


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
    _write_report(run_dir)
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


def _write_report(run_dir: Path) -> None:
    from itlbench.report.run_report import write_run_report_safely

    html, problem = write_run_report_safely(run_dir)
    if html is not None:
        console.print(f"[bold]Report[/] {html}", highlight=False)
    else:
        console.print(f"[yellow]warning:[/] no report written ({problem}); the records and summary.json are "
                      f"complete: retry with `itlbench report {run_dir}`", highlight=False)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory written by `itlbench run`.")],
           out: Annotated[Path | None, typer.Option(help="Write the report here (default: RUN_DIR).")] = None) -> None:
    """Write report.html (self-contained) and report.md with figures/ for one run."""
    from itlbench.report.run_report import write_run_report

    if not (run_dir / "run.json").is_file():
        _fail(ConfigError("RUN_DIR", f"{run_dir} has no run.json", "pass a directory written by `itlbench run`"))
    try:
        written = write_run_report(run_dir, out)
    except ItlbenchError as exc:
        _fail(exc)
        return
    console.print(f"[bold]Report[/] {written.html}  (markdown: {written.markdown})", highlight=False)
    print(written.html)


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Finished run directories (budgets, policies, engines).")],
    out: Annotated[Path | None, typer.Option(help="Report directory (default reports/<time>-compare).")] = None,
    slo: Annotated[str | None, typer.Option(help="SLOs to judge the runs by, e.g. 'ttft:le2k=2s,itl_p99=150ms'.")] = None,
    force: Annotated[bool, typer.Option(help="Compare runs whose workload, seed or injection differ.")] = False,
) -> None:
    """Compare finished runs: one row each, overlaid figures and a verdict per SLO."""
    import datetime as dt

    from itlbench.report.compare import print_comparison, write_compare_report

    for d in run_dirs:
        if not (d / "run.json").is_file():
            _fail(ConfigError("DIR", f"{d} has no run.json", "pass directories written by `itlbench run`"))
    target = out or Path("reports") / (dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + "-compare")
    try:
        command = shlex.join(["itlbench", "compare", *map(str, run_dirs), *(["--slo", slo] if slo else []),
                              *(["--force"] if force else [])])
        written, rows, verdict = write_compare_report(run_dirs, target, slo, force, command=command)
    except ItlbenchError as exc:
        _fail(exc)
        return
    print_comparison(console, rows, verdict, written.html)
    print(written.html)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    chunk_budget: Annotated[str, typer.Option("--chunk-budget", help="Budgets to run, comma-separated; 'none' = "
                                              "unchunked.")] = "256,512,2048,8192,none",
    policy: Annotated[str, typer.Option("--policy", help="budget, prefill-first, or both comma-separated.")] = "budget",
    out: Annotated[Path | None, typer.Option(help="Sweep directory (default reports/<time>-sweep-…).")] = None,
    slo: Annotated[str | None, typer.Option(help="SLOs for each run and the verdict.")] = None,
) -> None:
    """Run the same seeded workload once per chunk budget (any `itlbench run` option after these), then compare.

    Example: itlbench sweep --chunk-budget 512,2048,none --workload rag --inject 32k --duration 30
    """
    from itlbench.report.compare import print_comparison, write_compare_report
    from itlbench.report.sweep import SweepAborted, default_sweep_dir, parse_settings, run_sweep

    run_args = list(ctx.args) + (["--slo", slo] if slo else [])
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]

    def invoke_run(args: list[str]) -> int:
        try:
            code = command.main(args=args, prog_name="itlbench run", standalone_mode=False)
        except SystemExit as exc:  # click may exit on --help or usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # noqa: BLE001 - click usage errors name the bad option
            console.print(f"[bold red]error:[/] {exc}", highlight=False)
            code = 2
        return int(code or 0)

    try:
        settings = parse_settings(chunk_budget, policy)
        target = out or default_sweep_dir(run_args)
        done = run_sweep(settings, run_args, target, invoke_run, on_status=lambda s: console.print(f"[dim]{s}[/]"))
        if not done:
            _fail(ItlbenchError("sweep: no run finished; nothing to compare"))
            return
        command = shlex.join(["itlbench", "sweep", "--chunk-budget", chunk_budget, "--policy", policy,
                              *ctx.args, *(["--slo", slo] if slo else []), "--out", str(target)])
        written, rows, verdict = write_compare_report(done, target, slo, title="Chunk-budget sweep", command=command)
    except SweepAborted as exc:
        raise typer.Exit(exc.code) from None
    except ItlbenchError as exc:
        _fail(exc)
        return
    print_comparison(console, rows, verdict, written.html)
    print(target)


@app.command()
def phases(
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1); default: the bundled engine.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model (with --endpoint) or bundled preset / HF dir.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Bearer key for --endpoint.")] = None,
    lengths: Annotated[str | None, typer.Option(help="Prompt lengths, e.g. '1,16,128,512,2k,8k' (default: ×4 "
                                                "steps from 1 up to the context).")] = None,
    max_prompt: Annotated[str | None, typer.Option(help="Longest prompt to try (default: the context).")] = None,
    concurrency: Annotated[int, typer.Option(help="Decode batch to measure besides batch 1.")] = 32,
    output_tokens: Annotated[int, typer.Option(help="Tokens generated per request (decode is timed over these).")] = 32,
    repeats: Annotated[int, typer.Option(help="Requests per prompt length (the median is reported).")] = 3,
    chunk_budget: ChunkBudget = "none",
    device: Annotated[str, typer.Option(help="Bundled engine: auto, cpu or cuda.")] = "auto",
    out: Annotated[Path | None, typer.Option(help="Output directory (default reports/<time>-phases).")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Prefill and decode measured apart (the seeds' exercise A): time and tokens/s per prompt length."""
    from itlbench.report.phases import PhasesConfig, run_phases

    try:
        cfg = PhasesConfig(endpoint=endpoint, model=model, api_key=api_key, lengths=lengths, max_prompt=max_prompt,
                           concurrency=concurrency, output_tokens=output_tokens, repeats=repeats,
                           engine=None if endpoint else _engine_config(model=model, chunk_budget=chunk_budget,
                                                                       device=device, seed=seed),
                           out=out, seed=seed)
        written = run_phases(cfg, on_status=lambda s: console.print(f"[dim]{s}[/]"))
    except ItlbenchError as exc:
        _fail(exc)
        return
    console.print(f"[bold]Report[/] {written.html}", highlight=False)
    print(written.html.parent)


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
    from itlbench.units import parse_tokens

    fix = "give token counts such as 2048,32k (k = 1024)"
    values = [parse_tokens(part, flag, fix) for part in text.split(",") if part.strip()]
    if not values:
        raise ConfigError(flag, f"cannot read {text!r}", fix)
    return values


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
