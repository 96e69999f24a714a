"""Commands that run several measurements and compare them: `sweep`, `phases`."""

from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from itlbench.cli.app import AsJson, app, console, fail, print_json
from itlbench.cli.engine_options import engine_config_from_flags, engine_options
from itlbench.cli.run import ReceiveOtlp, check_sim, refuse_api_key, refuse_engine_flags, sim_intro_once
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.serving.build import require_engine_for


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    chunk_budget: Annotated[str | None, typer.Option("--chunk-budget", help="Budgets to run, comma-separated; "
                                                     "'none' = unchunked (default 256,512,2048,8192,none when "
                                                     "nothing else is swept); with --serve, values go into the "
                                                     "command as typed (SGLang's -1 = unchunked).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="budget, prefill-first, or both (= budget,prefill-first), "
                                        "comma-separated.")] = "budget",
    max_num_seqs: Annotated[str | None, typer.Option("--max-num-seqs", help="Running-sequence caps to sweep, "
                                                     "e.g. 32,64 ({max_num_seqs} in --serve).")] = None,
    rate: Annotated[str | None, typer.Option(help="Open-loop arrival rates to sweep, e.g. 1,2,4,8 (with "
                                             "--workload agent, sessions per second).")] = None,
    streams: Annotated[str | None, typer.Option(help="Closed-loop stream counts to sweep, e.g. 8,16,32.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="A setting of your own for --serve: "
                                                   "name=v1,v2 fills {name} in the template (repeatable).")] = None,
    serve: Annotated[str | None, typer.Option(help="Server command template, run once per point: {port} (a free "
                                              "loopback port), every swept setting ({chunk_budget}, …) "
                                              "and, with --receive-otlp, {otlp_endpoint} are filled in.")] = None,
    serve_timeout: Annotated[str, typer.Option(help="How long a --serve server may take to answer /health.")] = "600s",
    model: Annotated[str | None, typer.Option(help="The served model's name (with --serve; also fills {model}), or "
                                              "the bundled engine's preset.")] = None,
    repeat: Annotated[int, typer.Option(help="Runs per point (different prompt salts, same seed; --engine sim, "
                                        "which has no noise of its own: seeds seed, seed+1, …); ≥ 3 gives each "
                                        "figure a 95 % interval and a significance verdict.")] = 1,
    order: Annotated[str | None, typer.Option(help="With --repeat: 'interleaved' runs round k of every point "
                                              "before round k+1, so the machine's drift over the sweep falls on "
                                              "every point alike (the default; with --serve it starts each server "
                                              "once a round); 'grouped' runs a point's repeats back to back (the "
                                              "default with --serve: one server a point).")] = None,
    out: Annotated[Path | None, typer.Option(help="Sweep directory (default reports/<time>-sweep-…).")] = None,
    slo: Annotated[str | None, typer.Option(help="SLOs for each run and the verdict.")] = None,
    receive_otlp: ReceiveOtlp = None,
    as_json: AsJson = False,
) -> None:
    """Run the same seeded workload once per point (any `itlbench run` option after these), then compare.

    Exit status: 0 compared (a point that failed is named in the comparison); 1 no run finished;
    2 bad input (nothing written); 130 interrupted (sweep.json gives every point's status).

    Examples: itlbench sweep --chunk-budget 512,2048,none --workload rag --inject 32k --duration 30;
    itlbench sweep --serve 'vllm serve M --port {port} --max-num-batched-tokens {chunk_budget}'
    --chunk-budget 256,2048,8192 --model M --repeat 3
    """
    from itlbench.experiments.points import parse_axes
    from itlbench.experiments.run_options import default_sweep_dir, repeat_seed
    from itlbench.experiments.sweep import SweepAborted, SweepPlan, missing_lines, order_notes, run_sweep
    from itlbench.report.compare import write_compare_report
    from itlbench.report.compare_print import comparison_doc, print_comparison
    from itlbench.telemetry.span_capture import capture
    from itlbench.units import parse_duration_s

    run_args = list(ctx.args) + (["--slo", slo] if slo else []) + (["--model", model] if model else [])
    # one load value is a run option, not an axis (the point directories keep their budget names)
    if rate is not None and "," not in rate.strip(", "):
        run_args, rate = [*run_args, "--rate", rate.strip(", ")], None
    if streams is not None and "," not in streams.strip(", "):
        run_args, streams = [*run_args, "--streams", streams.strip(", ")], None
    try:
        budgets = chunk_budget
        if budgets is None and not any((max_num_seqs, rate, streams, set_)) and (
                serve is None or "{chunk_budget}" in serve):
            budgets = "256,512,2048,8192,none"
        if receive_otlp is not None and serve is None:
            raise ConfigError("--receive-otlp", "receives the spans of each point's --serve server; the bundled "
                              "engine's steps are recorded by each run itself",
                              "drop --receive-otlp, or sweep a server that exports spans (vLLM's "
                              "--otlp-traces-endpoint {otlp_endpoint} in --serve)")
        axes = parse_axes(budgets, policy, max_num_seqs, rate, streams, set_, served=serve is not None)
        plan = SweepPlan(axes, repeat=repeat, serve=serve, model=model, order=order,
                         serve_timeout_s=parse_duration_s(serve_timeout, "--serve-timeout"),
                         otlp=receive_otlp is not None,
                         first_seed=repeat_seed(run_args, serve is not None) if repeat > 1 else None)
        target = out or default_sweep_dir(run_args)

        def say(s: str) -> None:
            console.print(f"[dim]{s}[/]", highlight=False)

        # with --json, stdout carries one document: each run's own stdout line goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext(), \
                capture(receive_otlp, say) as spans, sim_intro_once():
            result = run_sweep(plan, run_args, target, invoke_run, on_status=say, spans=spans)
        missing = missing_lines(result)
        for line in missing:
            console.print(f"[yellow]{line}[/]", highlight=False)
        if not result.run_dirs:  # not a usage error: the points ran and failed (sweep.json says why)
            what = "[bold yellow]interrupted:[/] sweep" if result.interrupted else "[bold red]error:[/] sweep"
            console.print(f"{what}: no run finished; nothing to compare (see {target}/sweep.json)",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(130 if result.interrupted else 1)
        command = shlex.join(["itlbench", *sys.argv[1:]]) if sys.argv[1:2] == ["sweep"] else "itlbench sweep"
        written, rows, verdict = write_compare_report(result.run_dirs, target, slo, title="Sweep", command=command,
                                                      missing=missing, notes=order_notes(result))
    except SweepAborted as exc:
        raise typer.Exit(exc.code) from None
    except ItlbenchError as exc:
        fail(exc)
        return
    if as_json:
        print_json(comparison_doc(rows, verdict, written.html) | {"sweep_dir": str(target)})
    else:
        print_comparison(console, rows, verdict, written.html)
        print(target)
    if result.interrupted:
        raise typer.Exit(130)


def invoke_run(args: list[str]) -> int:
    """`itlbench run ARGS` in this process; its exit code (2 for usage errors, which it has printed)."""
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    try:
        code = command.main(args=args, prog_name="itlbench run", standalone_mode=False)
    except SystemExit as exc:  # click may exit on --help or usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - click usage errors name the bad option
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        code = 2
    return int(code or 0)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def capacity(
    ctx: typer.Context,
    slo: Annotated[str | None, typer.Option(help="SLOs every point must meet, e.g. 'ttft=2s,itl_p99=100ms' "
                                            "(default: the default SLOs).")] = None,
    stall_budget: Annotated[str | None, typer.Option(help="Freezing a point may show: worst=1s (longest gap), "
                                                     "stalled=1% (of stream time), victims=10% (of requests).")] = None,
    axis: Annotated[str | None, typer.Option(help="rate (open-loop arrivals/s; --workload agent: sessions/s), "
                                             "streams (closed-loop) or time-scale (a --trace replay's speed, "
                                             "× recorded; the default with --trace; else rate).",
                                             show_default=False)] = None,
    start: Annotated[float, typer.Option(help="First load tried; the search doubles it until a point misses.")] = 1.0,
    rate_max: Annotated[float | None, typer.Option("--rate-max", help="Highest load to try (rate, streams or time scale).")] = None,
    resolution: Annotated[float, typer.Option(help="Stop bisecting when the bracket is this share of the load "
                                              "(streams: one apart).")] = 0.1,
    repeat: Annotated[int, typer.Option(help="Runs per point near the boundary (a point meets only if all do; "
                                        "--engine sim, which has no noise of its own: seeds seed, seed+1, …).")] = 2,
    max_points: Annotated[int, typer.Option(help="Most points the search may run (≥ 1).")] = 14,
    serve: Annotated[str | None, typer.Option(help="Server command template ({port}, {model}; {otlp_endpoint} with "
                                              "--receive-otlp), started once for the search.")] = None,
    serve_timeout: Annotated[str, typer.Option(help="How long a --serve server may take to answer /health.")] = "600s",
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1) of a running server.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name, or the bundled engine's preset.")] = None,
    out: Annotated[Path | None, typer.Option(help="Directory (default reports/<time>-capacity-…).")] = None,
    receive_otlp: ReceiveOtlp = None,
) -> None:
    """Search the highest rate (or stream count, or a trace's speed) at which every SLO and the stall budget hold; any `itlbench run`
    option after these sets the workload.

    Exit status: 0 a capacity was found; 1 none was (no load tried met), or the search ended early (a point's
    window held no request, too short for its load: give a longer --duration); 2 bad input (nothing written);
    130 interrupted (capacity.json and the report say what was established so far).

    Example: itlbench capacity --workload chat --slo itl_p99=100ms --stall-budget worst=1s,victims=10% --duration 20
    """
    from itlbench.cli.capacity import run_capacity

    run_capacity(ctx.args, slo=slo, stall_budget=stall_budget, axis=axis, start=start, rate_max=rate_max,
                 resolution=resolution, repeat=repeat, max_points=max_points, serve=serve,
                 serve_timeout=serve_timeout, endpoint=endpoint, model=model, out=out, invoke_run=invoke_run,
                 receive_otlp=receive_otlp)


# the bundled engine's flags phases takes, and the simulator's (--engine sim --gpu h100 --tp 2 --dtype fp8);
# --max-model-len sets the context the default lengths climb to, --sim-time-scale paces the simulator faster
PHASES_ENGINE_FLAGS = ("chunk_budget", "device", "seed", "engine", "gpu", "tp", "dtype", "kv_cache_dtype",
                       "max_num_seqs", "max_model_len", "sim_time_scale")


@app.command()
@engine_options(only=PHASES_ENGINE_FLAGS, defaults={"chunk_budget": "none"})
def phases(
    ctx: typer.Context,
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1); default: the bundled engine.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model (with --endpoint; default: the only one it lists) or bundled "
                                                "preset / HF dir (--engine sim: a preset, default llama-3.1-8b).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Bearer key for --endpoint; prefer setting ITLBENCH_API_KEY (a value given here shows in ps).")] = None,
    lengths: Annotated[str | None, typer.Option(help="Prompt lengths, e.g. '1,16,128,512,2k,8k' (default: 1, 16, 128, "
                                                "then ×4 from 512 up to the context; --engine sim: up to 32k).")] = None,
    max_prompt: Annotated[str | None, typer.Option(help="Longest prompt to try (default: the context).")] = None,
    concurrency: Annotated[int, typer.Option(help="Decode batch to measure besides batch 1.")] = 32,
    output_tokens: Annotated[int, typer.Option(help="Tokens generated per request (decode is timed over these).")] = 32,
    repeats: Annotated[int, typer.Option(help="Requests per prompt length (the median is reported).")] = 3,
    out: Annotated[Path | None, typer.Option(help="Output directory (default reports/<time>-phases).")] = None,
    engine_flags: dict | None = None,
) -> None:
    """Prefill and decode measured apart (the source documents' exercise A): time and tokens/s per prompt length.

    --engine sim serves the simulator in real time, each step taking the time the cost model prices for --gpu
    (--tp, --dtype): the same table for a GPU you do not have; its default lengths stop at 32k unless
    --max-model-len (or --max-prompt) says how far to go, and --sim-time-scale 4 runs it four times faster (every
    time printed 1/4 of the GPU's). Example: itlbench phases --engine sim --model llama-3.3-70b --gpu h100 --tp 2
    --dtype fp8 --max-model-len 128k
    """
    from itlbench.experiments.phases import PhasesConfig, run_phases
    from itlbench.experiments.phases_report import print_phases, read_phases

    try:
        refuse_engine_flags(ctx, endpoint)
        refuse_api_key(ctx, endpoint)
        engine = None if endpoint else engine_config_from_flags(engine_flags, model=model)
        if engine is not None:
            require_engine_for(engine)
            check_sim(engine)
        cfg = PhasesConfig(endpoint=endpoint, model=model, api_key=api_key, lengths=lengths, max_prompt=max_prompt,
                           concurrency=concurrency, output_tokens=output_tokens, repeats=repeats,
                           engine=engine,
                           out=out, seed=engine_flags["seed"])
        written = run_phases(cfg, on_status=lambda s: console.print(f"[dim]{s}[/]"))
    except ItlbenchError as exc:
        fail(exc)
        return
    print_phases(console, read_phases(written.html.parent), output_tokens)
    console.print(f"[bold]Report[/] {written.html}", highlight=False)
    print(written.html.parent)
