"""`itlbench capacity` from the command line: the target (bundled engine, --endpoint or --serve), the runs, the files.

Kept apart from the typer declaration in studies.py so the command's options stay readable there.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import typer

from itlbench.cli.app import console, fail
from itlbench.cli.run import sim_intro_once
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.experiments.capacity import (
    CapacityPlan,
    SearchInterrupted,
    SearchPoint,
    SearchStopped,
    measure_point,
    search,
    write_capacity_json,
)
from itlbench.experiments.capacity_answer import answer_line
from itlbench.experiments.capacity_judge import RunJudgement, judge_run, parse_stall_budget
from itlbench.experiments.capacity_report import recorded_sim_check, write_capacity_report
from itlbench.experiments.run_options import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    bundled_target,
    default_sweep_dir,
    remove_if_empty,
    repeat_seed,
    stopped_early,
    terminate_as_interrupt,
    with_seed,
)
from itlbench.experiments.served import (
    OTLP_FIELD,
    ServedServer,
    ServerFailed,
    check_template,
    free_port,
    substitute,
)
from itlbench.rundir.outdir import make_dir
from itlbench.telemetry.span_capture import SpanCapture, capture, save_and_warn
from itlbench.units import parse_duration_s

OWNED = ("--rate", "--streams", "--time-scale", "--out", "--endpoint", "--repeat")


def default_axis(run_args: list[str]) -> str:
    """time-scale for a --trace replay (its rows carry their own arrival times, so there is no --rate to
    search), else rate."""
    return "time-scale" if any(a == "--trace" or a.startswith("--trace=") for a in run_args) else "rate"


@contextlib.contextmanager
def _target(serve: str | None, endpoint: str | None, model: str | None, out: Path,
            timeout_s: float, say: Callable[[str], None],
            spans: SpanCapture | None = None, bundled: str = "the bundled engine") -> Iterator[tuple[list[str], str]]:
    """The run flags that point at the server under test, and its name for the report."""
    if serve is None:
        yield ([] if endpoint is None else ["--endpoint", endpoint]), endpoint or bundled
        return
    port = free_port()
    command = substitute(serve, {"port": str(port), **({"model": model} if model else {}),
                                 **({OTLP_FIELD: spans.traces_url} if spans else {})})
    say(f"server: {command}")
    with ServedServer(command, port, out / "server.log", timeout_s) as server:
        yield ["--endpoint", server.base_url], command


def run_capacity(run_args: list[str], *, slo: str | None, stall_budget: str | None, axis: str | None, start: float,
                 rate_max: float | None, resolution: float, repeat: int, max_points: int, serve: str | None,
                 serve_timeout: str, endpoint: str | None, model: str | None, out: Path | None,
                 invoke_run: Callable[[list[str]], int], receive_otlp: str | None = None) -> None:
    def say(text: str) -> None:
        console.print(f"[dim]{text}[/]", highlight=False)

    target: Path | None = None
    axis = axis or default_axis(run_args)
    try:
        for flag in OWNED:
            if any(a == flag or a.startswith(flag + "=") for a in run_args):
                raise ConfigError(flag, "is set by the capacity search itself",
                                  "the search chooses the load; give --axis, --start and --rate-max instead")
        if serve is not None and endpoint is not None:
            raise ConfigError("--serve", "given together with --endpoint", "use one: a command to start, or a URL")
        if serve is not None:
            check_template(serve, [], otlp=receive_otlp is not None)
        elif receive_otlp is not None and endpoint is None:
            raise ConfigError("--receive-otlp", "receives the spans of a server given with --serve or --endpoint; "
                              "the bundled engine's steps are recorded by each run itself",
                              "drop --receive-otlp, or search a server that exports spans (vLLM's "
                              "--otlp-traces-endpoint {otlp_endpoint} in --serve)")
        plan = CapacityPlan(axis=axis, start=start, load_max=rate_max, resolution=resolution, repeat=repeat,
                            max_points=max_points, slo=slo, budget=parse_stall_budget(stall_budget))
        timeout_s = parse_duration_s(serve_timeout, "--serve-timeout")
        target = out or default_sweep_dir(run_args, kind="capacity")
        if target.exists() and any(target.iterdir()):
            raise ConfigError("--out", f"{target} already holds files", "choose a new directory")
        make_dir(target)
        extra = [*run_args, *(["--slo", slo] if slo else []), *(["--model", model] if model else [])]
        first_seed = repeat_seed(extra, served=serve is not None or endpoint is not None)
        counts: dict[float, int] = {}
        with terminate_as_interrupt() as arm, capture(receive_otlp, say) as spans, sim_intro_once(), \
                _target(serve, endpoint, model, target, timeout_s, say, spans, bundled_target(run_args)) as (flags, name):

            def run_once(load: float) -> RunJudgement:
                counts[load] = counts.get(load, 0) + 1
                run_dir = target / f"{axis}{plan.fmt(load)}" / f"run{counts[load]}"
                seed = None if first_seed is None else first_seed + counts[load] - 1
                args = extra if seed is None else with_seed(extra, seed)
                code = invoke_run([*args, *flags, f"--{axis}", plan.fmt(load), "--no-live", "--brief",
                                   "--out", str(run_dir)])
                arm()
                return _judged(run_dir, code, load, seed)

            def _judged(run_dir: Path, code: int, load: float, seed: int | None) -> RunJudgement:
                """The run's verdict, or why the search cannot go on (interrupted, refused, nothing written)."""
                if code == EXIT_USAGE and not any(target.glob("*/run*/run.json")):
                    remove_if_empty(target)
                    raise typer.Exit(EXIT_USAGE)  # the first run refused its options (it said why)
                kept = (run_dir / "run.json").is_file()
                if code == EXIT_INTERRUPTED and not kept:
                    raise SearchInterrupted()
                if not kept:
                    raise SearchStopped(f"the run at {axis} {plan.fmt(load)} wrote nothing (exit {code}; its "
                                        "error is above)")
                save_and_warn(spans, run_dir, say)
                judged = judge_run(run_dir, slo, plan.budget)
                judged.seed = seed
                if code == EXIT_INTERRUPTED or stopped_early(run_dir):  # Ctrl-C or SIGTERM: end the search
                    raise SearchInterrupted(run=judged)
                if judged.disturbed:
                    say(f"{axis} {plan.fmt(load)}: {run_dir.name} missed while disturbed "
                        f"({'; '.join(judged.disturbed)[:300]})")
                return judged

            def measure(load: float, phase: str, repeats: int) -> SearchPoint:
                return measure_point(load, phase, repeats, lambda: run_once(load))

            result = search(plan, measure, on_status=say)
        write_capacity_json(result, target)
        command = shlex.join(["itlbench", *sys.argv[1:]]) if sys.argv[1:2] == ["capacity"] else "itlbench capacity"
        written = write_capacity_report(result, target, command, name)
    except KeyboardInterrupt:  # before the search began (a --serve server starting) or while writing its files
        kept = f"what it wrote is in {target}" if target is not None and target.is_dir() else "nothing was written"
        console.print(f"[bold yellow]interrupted:[/] capacity: stopped before the search had an answer; {kept}",
                      highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except ServerFailed as exc:
        fail(ItlbenchError(f"capacity: {exc}"))
        return
    except ItlbenchError as exc:
        fail(exc)
        return
    console.print(f"[bold]{answer_line(result)}[/]", highlight=False)
    if (check := recorded_sim_check(result)) is not None:  # a simulated answer: how far to trust the simulator
        from itlbench.sim.accuracy import check_line

        console.print(f"[bold]Sim check[/] {check_line(check)}", highlight=False)
    console.print(f"[bold]Report[/] {written.html}", highlight=False)
    print(target)
    if result.exit_code:
        raise typer.Exit(result.exit_code)  # 130 interrupted, 1 no capacity found: every record is written
