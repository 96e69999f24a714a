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
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.experiments.capacity import (
    CapacityPlan,
    RunJudgement,
    SearchPoint,
    answer_line,
    judge_run,
    measure_point,
    parse_stall_budget,
    search,
    write_capacity_json,
)
from itlbench.experiments.capacity_report import recorded_sim_check, write_capacity_report
from itlbench.experiments.served import (
    OTLP_FIELD,
    ServedServer,
    ServerFailed,
    check_template,
    free_port,
    substitute,
)
from itlbench.experiments.sweep import default_sweep_dir, stopped_early, terminate_as_interrupt
from itlbench.rundir.outdir import make_dir
from itlbench.telemetry.span_capture import SpanCapture, capture, save_and_warn
from itlbench.units import parse_duration_s

OWNED = ("--rate", "--streams", "--out", "--endpoint", "--repeat")


@contextlib.contextmanager
def _target(serve: str | None, endpoint: str | None, model: str | None, out: Path,
            timeout_s: float, say: Callable[[str], None],
            spans: SpanCapture | None = None) -> Iterator[tuple[list[str], str]]:
    """The run flags that point at the server under test, and its name for the report."""
    if serve is None:
        yield ([] if endpoint is None else ["--endpoint", endpoint]), endpoint or "the bundled engine"
        return
    port = free_port()
    command = substitute(serve, {"port": str(port), **({"model": model} if model else {}),
                                 **({OTLP_FIELD: spans.traces_url} if spans else {})})
    say(f"server: {command}")
    with ServedServer(command, port, out / "server.log", timeout_s) as server:
        yield ["--endpoint", server.base_url], command


def run_capacity(run_args: list[str], *, slo: str | None, stall_budget: str | None, axis: str, start: float,
                 rate_max: float | None, resolution: float, repeat: int, max_points: int, serve: str | None,
                 serve_timeout: str, endpoint: str | None, model: str | None, out: Path | None,
                 invoke_run: Callable[[list[str]], int], receive_otlp: str | None = None) -> None:
    def say(text: str) -> None:
        console.print(f"[dim]{text}[/]", highlight=False)

    try:
        for flag in OWNED:
            if any(a == flag or a.startswith(flag + "=") for a in run_args):
                raise ConfigError(flag, "is set by the capacity search itself",
                                  "the search chooses the load; give --axis, --start and --rate-max instead")
        if serve is not None and endpoint is not None:
            raise ConfigError("--serve", "given together with --endpoint", "use one: a command to start, or a URL")
        if serve is not None:
            check_template(serve, [], otlp=receive_otlp is not None)
        plan = CapacityPlan(axis=axis, start=start, load_max=rate_max, resolution=resolution, repeat=repeat,
                            max_points=max_points, slo=slo, budget=parse_stall_budget(stall_budget))
        timeout_s = parse_duration_s(serve_timeout, "--serve-timeout")
        target = out or default_sweep_dir(run_args, kind="capacity")
        if target.exists() and any(target.iterdir()):
            raise ConfigError("--out", f"{target} already holds files", "choose a new directory")
        make_dir(target)
        extra = [*run_args, *(["--slo", slo] if slo else []), *(["--model", model] if model else [])]
        counts: dict[float, int] = {}
        with terminate_as_interrupt() as arm, capture(receive_otlp, say) as spans, \
                _target(serve, endpoint, model, target, timeout_s, say, spans) as (flags, name):

            def run_once(load: float) -> RunJudgement:
                counts[load] = counts.get(load, 0) + 1
                run_dir = target / f"{axis}{plan.fmt(load)}" / f"run{counts[load]}"
                code = invoke_run([*extra, *flags, f"--{axis}", plan.fmt(load), "--no-live", "--out", str(run_dir)])
                arm()
                if code == 2 and not any(target.glob("*/run*/run.json")):
                    raise typer.Exit(2)  # the first run refused its options (it said why)
                if not (run_dir / "run.json").is_file():
                    raise ItlbenchError(f"capacity: the run at {axis} {plan.fmt(load)} wrote nothing (exit {code})")
                save_and_warn(spans, run_dir, say)
                judged = judge_run(run_dir, slo, plan.budget)
                if stopped_early(run_dir):  # Ctrl-C or SIGTERM ended the run: end the search
                    raise KeyboardInterrupt
                if judged.disturbed:
                    say(f"{axis} {plan.fmt(load)}: {run_dir.name} missed while disturbed "
                        f"({judged.disturbed[0][:140]})")
                return judged

            def measure(load: float, phase: str, repeats: int) -> SearchPoint:
                return measure_point(load, phase, repeats, lambda: run_once(load))

            result = search(plan, measure, on_status=say)
        write_capacity_json(result, target)
        command = shlex.join(["itlbench", *sys.argv[1:]]) if sys.argv[1:2] == ["capacity"] else "itlbench capacity"
        written = write_capacity_report(result, target, command, name)
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
    if result.interrupted:
        raise typer.Exit(130)
