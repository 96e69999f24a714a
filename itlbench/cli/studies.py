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
from itlbench.errors import ItlbenchError
from itlbench.serving.build import require_engine_for


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    chunk_budget: Annotated[str, typer.Option("--chunk-budget", help="Budgets to run, comma-separated; 'none' = "
                                              "unchunked.")] = "256,512,2048,8192,none",
    policy: Annotated[str, typer.Option("--policy", help="budget, prefill-first, or both comma-separated.")] = "budget",
    out: Annotated[Path | None, typer.Option(help="Sweep directory (default reports/<time>-sweep-…).")] = None,
    slo: Annotated[str | None, typer.Option(help="SLOs for each run and the verdict.")] = None,
    as_json: AsJson = False,
) -> None:
    """Run the same seeded workload once per chunk budget (any `itlbench run` option after these), then compare.

    Example: itlbench sweep --chunk-budget 512,2048,none --workload rag --inject 32k --duration 30
    """
    from itlbench.experiments.sweep import SweepAborted, default_sweep_dir, parse_settings, run_sweep
    from itlbench.report.compare import comparison_doc, print_comparison, write_compare_report

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
        # with --json, stdout carries one document: each run's own stdout line goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            done = run_sweep(settings, run_args, target, invoke_run,
                             on_status=lambda s: console.print(f"[dim]{s}[/]"))
        if not done:
            fail(ItlbenchError("sweep: no run finished; nothing to compare"))
            return
        command = shlex.join(["itlbench", "sweep", "--chunk-budget", chunk_budget, "--policy", policy,
                              *ctx.args, *(["--slo", slo] if slo else []), "--out", str(target)])
        written, rows, verdict = write_compare_report(done, target, slo, title="Chunk-budget sweep", command=command)
    except SweepAborted as exc:
        raise typer.Exit(exc.code) from None
    except ItlbenchError as exc:
        fail(exc)
        return
    if as_json:
        print_json(comparison_doc(rows, verdict, written.html) | {"sweep_dir": str(target)})
        return
    print_comparison(console, rows, verdict, written.html)
    print(target)


@app.command()
@engine_options(only=("chunk_budget", "device", "seed"), defaults={"chunk_budget": "none"})
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
    out: Annotated[Path | None, typer.Option(help="Output directory (default reports/<time>-phases).")] = None,
    engine_flags: dict | None = None,
) -> None:
    """Prefill and decode measured apart (the source documents' exercise A): time and tokens/s per prompt length."""
    from itlbench.experiments.phases import PhasesConfig, run_phases

    try:
        engine = None if endpoint else engine_config_from_flags(engine_flags, model=model)
        if engine is not None:
            require_engine_for(engine)
        cfg = PhasesConfig(endpoint=endpoint, model=model, api_key=api_key, lengths=lengths, max_prompt=max_prompt,
                           concurrency=concurrency, output_tokens=output_tokens, repeats=repeats,
                           engine=engine,
                           out=out, seed=engine_flags["seed"])
        written = run_phases(cfg, on_status=lambda s: console.print(f"[dim]{s}[/]"))
    except ItlbenchError as exc:
        fail(exc)
        return
    console.print(f"[bold]Report[/] {written.html}", highlight=False)
    print(written.html.parent)
