"""`itlbench sweep`: the same seeded workload once per point (budget, policy, load, …), then one comparison.

Each point runs through `itlbench run` itself with the user's run options, into `<sweep dir>/<point>/`
(`…/<point>/run1…N` with `--repeat N`), so a sweep's runs are ordinary runs (each with its own report)
and `itlbench compare` can re-read them. With `--serve 'CMD'` each point gets its own server from the
command template (see served.py), measured as an `--endpoint`; a point whose server fails is recorded
in `sweep.json` with its log and the sweep goes on. A run stopped by Ctrl-C or SIGTERM ends the sweep
(its server is stopped first); the comparison still covers the finished runs.

`sweep.json` lists every planned point from the start, each with a status that is never better than
what happened: `ok` (every repeat finished), `interrupted` (Ctrl-C or SIGTERM cut it short: the runs it
finished are compared, a cut-off run's records are kept but not compared), `failed` (the reason
is beside it) or `not run`.

With `--repeat N` the runs go in rounds by default (`--order interleaved`): round k runs every point's k-th
repeat, so a machine that slows or speeds up over the sweep (another job, heat, a neighbour on the host)
moves every point alike instead of passing for the difference between two points. A `--serve` sweep keeps
a point's repeats together by default (`--order grouped`): interleaved, each server would be started once a
round, and a real server's start takes minutes; the comparison then says the order was grouped.

The simulator on its virtual clock has no noise: repeats of one seed give identical figures, and a
95 % interval over them is a point. So with `--engine sim` repeat k runs seed + k - 1 (each run's
seed is in its run.json): the spread is the load's, as docs/simulator.md says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlbench.errors import EXIT_ENDED_EARLY, ConfigError
from itlbench.experiments.points import Axis, Point, grid
from itlbench.experiments.run_options import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    check_run_args,
    remove_if_empty,
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
    tail,
)
from itlbench.harness.run_config import after_checks
from itlbench.report.data import read_json
from itlbench.rundir.outdir import make_dir
from itlbench.telemetry.span_capture import SpanCapture, save_and_warn

InvokeRun = Callable[[list[str]], int]
OK, INTERRUPTED, FAILED, NOT_RUN, RUNNING = "ok", "interrupted", "failed", "not run", "running"
INTERLEAVED, GROUPED = "interleaved", "grouped"
ORDERS = (INTERLEAVED, GROUPED)


@dataclass
class SweepPlan:
    """What to run: the points, how often each, and (optionally) the server command template."""

    axes: list[Axis]
    repeat: int = 1
    serve: str | None = None
    serve_timeout_s: float = 600.0
    model: str | None = None
    otlp: bool = False  # --receive-otlp: {otlp_endpoint} may appear in the template
    first_seed: int | None = None  # repeats run first_seed, first_seed + 1, … (the simulator); None: one seed
    order: str | None = None  # INTERLEAVED or GROUPED; None: interleaved unless --serve

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ConfigError("--repeat", f"must be ≥ 1, got {self.repeat}", "e.g. --repeat 3")
        if self.order is not None and self.order not in ORDERS:
            raise ConfigError("--order", f"unknown order {self.order!r}", f"use one of {', '.join(ORDERS)}")
        if self.order is not None and self.repeat == 1:
            raise ConfigError("--order", "orders the repeats of each point, and there is one run a point",
                              "add --repeat 3, or leave --order out")
        if self.order is None:
            self.order = GROUPED if self.serve is not None else INTERLEAVED
        if self.serve is not None:
            check_template(self.serve, [a.name for a in self.axes if a.name not in ("rate", "streams")], self.otlp)
        elif any(a.user for a in self.axes):
            raise ConfigError("--set", "only a --serve template knows what a setting of your own means",
                              "add --serve 'CMD … {name} …', or sweep an itlbench flag")

    @property
    def points(self) -> list[Point]:
        return grid(self.axes)

    @property
    def rounds(self) -> list[range]:
        """The repeats each pass over the points runs: one a round when interleaved, all at once when grouped."""
        if self.order == GROUPED or self.repeat == 1:
            return [range(1, self.repeat + 1)]
        return [range(i, i + 1) for i in range(1, self.repeat + 1)]


@dataclass
class PointResult:
    """One point's outcome: its finished runs (compared), runs cut off (records kept), and its status."""

    point: Point
    dir: Path
    runs: list[Path] = field(default_factory=list)
    partial: list[Path] = field(default_factory=list)
    status: str = NOT_RUN
    reason: str | None = None
    command: str | None = None
    seeds: list[int] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.status, self.reason = FAILED, reason

    def interrupt(self, reason: str) -> None:
        self.status, self.reason = INTERRUPTED, reason

    @property
    def server_logs(self) -> list[Path]:
        """`server.log` (one server for the point), or `server-run<k>.log` (one a round, interleaved)."""
        return sorted(self.dir.glob("server*.log"), key=lambda p: (len(p.name), p.name)) if self.dir.is_dir() else []

    def as_dict(self, root: Path) -> dict[str, Any]:
        logs = self.server_logs
        return {"point": self.point.dirname, "label": self.point.label, "settings": self.point.as_dict(),
                "status": self.status, "reason": self.reason,
                "runs": [str(r.relative_to(root)) for r in self.runs],
                "partial_runs": [str(r.relative_to(root)) for r in self.partial],
                "seeds": self.seeds or None, "serve_command": self.command,
                "server_log": str(logs[0].relative_to(root)) if logs else None,
                "server_logs": [str(log.relative_to(root)) for log in logs] or None}


@dataclass
class SweepResult:
    points: list[PointResult]
    interrupted: bool = False
    cut: PointResult | None = None  # the point whose run the interruption cut, if it came during one
    order: str = INTERLEAVED
    repeat: int = 1

    @property
    def run_dirs(self) -> list[Path]:
        """The finished runs, which the comparison covers."""
        return [r for p in self.points for r in p.runs]

    @property
    def missing(self) -> list[PointResult]:
        return [p for p in self.points if p.status != OK]


def annotate_run(run_dir: Path, point: Point, repeat: int, of: int, command: str | None,
                 seed: int | None = None) -> None:
    """Record in run.json which sweep point this run measured (and the server command it ran against;
    `seed`: the seed this repeat ran, where the sweep varies it)."""
    path = run_dir / "run.json"
    doc = read_json(path)
    if doc is None:
        return
    doc["sweep"] = {"point": point.dirname, "label": point.label, "settings": point.as_dict(),
                    "repeat": repeat, "repeats": of}
    if command is not None:
        doc["sweep"]["serve_command"] = command
    if seed is not None:
        doc["sweep"]["seed"] = seed
        doc["sweep"]["varies"] = ["seed"]
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def finished(run_dir: Path) -> bool:
    """A run that measured its whole window and wrote its summary (one cut off before either is not)."""
    return (run_dir / "summary.json").is_file() and not stopped_early(run_dir)


def _cut_reason(i: int, of: int, kept: bool, done: bool) -> str:
    """Why a point is interrupted, from what its run `i` of `of` left behind."""
    which = "its run" if of == 1 else f"run {i} of {of}"
    earlier = "" if i == 1 or done else f" (runs 1–{i - 1} finished and are compared)" if i > 2 else \
        " (run 1 finished and is compared)"
    if done:
        return f"interrupted after {which} (its finished runs are compared)"
    if not kept:
        return f"interrupted during {which}, before it recorded anything{earlier}"
    return f"interrupted during {which}: its records are kept, left out of the comparison{earlier}"


def _runs_of_point(plan: SweepPlan, point: Point, point_dir: Path, args: list[str], invoke_run: InvokeRun,
                   result: PointResult, server: ServedServer | None, on_status: Callable[[str], None],
                   arm: Callable[[], None], spans: SpanCapture | None, repeats: range) -> bool:
    """The point's `repeats`, setting its status (ok once its last repeat is); False when the sweep must stop
    (a run was interrupted)."""
    for i in repeats:
        run_dir = point_dir if plan.repeat == 1 else point_dir / f"run{i}"
        if plan.repeat > 1:
            on_status(f"  repeat {i}/{plan.repeat}")
        seed = None if plan.first_seed is None else plan.first_seed + i - 1
        code = invoke_run([*(args if seed is None else with_seed(args, seed)), "--brief", "--out", str(run_dir)])
        arm()
        kept = (run_dir / "run.json").is_file()
        if kept:
            annotate_run(run_dir, point, i, plan.repeat, result.command, seed)
            save_and_warn(spans, run_dir, on_status)
            (result.runs if finished(run_dir) else result.partial).append(run_dir)
            if seed is not None:
                result.seeds.append(seed)
        if server is not None and server.died() is not None:
            result.fail(f"the server exited with code {server.died()} during the run")
            return True
        if code == EXIT_INTERRUPTED or (kept and stopped_early(run_dir)):
            done = kept and finished(run_dir)
            if done and i == plan.repeat:
                result.status = OK  # the Ctrl-C came after the measurement (its report, say): the point is whole
            else:
                result.interrupt(_cut_reason(i, plan.repeat, kept, done))
            return False
        if code == EXIT_USAGE and not kept and not result.runs:
            raise SweepAborted(code)
        if code not in (0, EXIT_ENDED_EARLY) or not kept or not finished(run_dir):  # exit 1: its records count
            result.fail(f"run {i} exited with code {code}" + ("" if kept else " and recorded nothing")
                        + ("" if not kept or finished(run_dir) else ", without a summary.json")
                        + " (its error is above)")
            return True
    result.status = OK if repeats.stop > plan.repeat else RUNNING
    return True


def run_sweep(plan: SweepPlan, run_args: list[str], out_dir: Path, invoke_run: InvokeRun,
              on_status: Callable[[str], None] = lambda s: None, spans: SpanCapture | None = None) -> SweepResult:
    """Run every point (in order) into out_dir/<point>; sweep.json lists every planned point from the start
    and is rewritten after each. `invoke_run(args)` runs `itlbench run args` and returns its exit code; `spans`
    (--receive-otlp) fills {otlp_endpoint} and takes each run's spans into its directory."""
    check_run_args(run_args, plan.serve is not None)
    points = plan.points
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError("--out", f"{out_dir} already holds files", "choose a new directory")
    result = SweepResult([PointResult(p, out_dir / p.dirname) for p in points], order=plan.order or INTERLEAVED,
                         repeat=plan.repeat)
    current: PointResult | None = None
    say, invoke_run = _held_until_checked(on_status, invoke_run, hold=plan.serve is None)
    on_status = say
    with terminate_as_interrupt() as arm:
        try:
            _write_manifest(plan, result, out_dir)
            for r, repeats in enumerate(plan.rounds, 1):
                for n, pr in enumerate(result.points, 1):
                    if pr.status == FAILED:  # a point that failed in an earlier round is not run again
                        continue
                    current, pr.status = pr, RUNNING
                    rnd = f"round {r}/{len(plan.rounds)}, " if len(plan.rounds) > 1 else ""
                    on_status(f"sweep {rnd}point {n}/{len(points)}: {pr.point.dirname}")
                    if not _point_round(plan, pr, repeats, run_args, invoke_run, on_status, arm, spans,
                                        first=n == 1 and r == 1, out_dir=out_dir):
                        result.interrupted = True
                        result.cut = pr if pr.status == INTERRUPTED else None
                        break
                    current = None
                    say.release()  # said late where the run never called back (a stand-in), else a no-op
                    _write_manifest(plan, result, out_dir)
                if result.interrupted:
                    break
        except KeyboardInterrupt:  # outside a run (between runs, a server starting or stopping)
            result.interrupted = True
            if current is not None and current.status == RUNNING:
                result.cut = current
                current.interrupt("interrupted before its run finished"
                                  + (": its records are kept, left out of the comparison" if current.partial else ""))
    if result.interrupted:
        _cut_rounds(result, plan.repeat)
    if out_dir.exists():
        _write_manifest(plan, result, out_dir)
    return result


class _Held:
    """Status lines held (while `holding`) until `release` says them."""

    def __init__(self, say: Callable[[str], None], holding: bool) -> None:
        self.say, self.holding, self.lines = say, holding, list[str]()

    def __call__(self, text: str) -> None:
        (self.lines.append if self.holding else self.say)(text)

    def release(self) -> None:
        if self.holding:
            self.holding = False
            for line in self.lines:
                self.say(line)


def _held_until_checked(on_status: Callable[[str], None], invoke_run: InvokeRun, hold: bool) -> tuple[_Held, InvokeRun]:
    """The first point's banner waits until its first run has passed its own checks (`after_checks`): options that
    run refuses end the sweep (SweepAborted) in the run's one line, without a banner for a point that never started.
    Not with --serve: a server's start (minutes, with its own lines) comes before the run."""
    held = _Held(on_status, hold)

    def invoke(args: list[str]) -> int:
        with after_checks(held.release):
            code = invoke_run(args)
        if code != EXIT_USAGE:
            held.release()
        return code
    return held, invoke


def _point_round(plan: SweepPlan, pr: PointResult, repeats: range, run_args: list[str], invoke_run: InvokeRun,
                 on_status: Callable[[str], None], arm: Callable[[], None], spans: SpanCapture | None,
                 first: bool, out_dir: Path) -> bool:
    """The point's runs of one round (all of them when grouped); False when the sweep must stop."""
    args = [*run_args, *pr.point.run_args(served=plan.serve is not None)]
    try:
        if plan.serve is None:
            return _runs_of_point(plan, pr.point, pr.dir, args, invoke_run, pr, None, on_status, arm, spans, repeats)
        return _served_point(plan, pr.point, pr.dir, args, invoke_run, pr, on_status, arm, spans, repeats)
    except SweepAborted:
        if first:
            (out_dir / "sweep.json").unlink(missing_ok=True)
            remove_if_empty(out_dir)
            raise
        pr.fail("its run refused the options (exit 2; its error is above)")
        return True


def _cut_rounds(result: SweepResult, repeat: int) -> None:
    """After an interruption, a point left between rounds has finished runs but not all: interrupted, not ok."""
    for pr in result.points:
        if pr.status == RUNNING:
            pr.interrupt(f"interrupted after {len(pr.runs)} of its {repeat} runs (its finished runs are compared)")


def _served_point(plan: SweepPlan, point: Point, point_dir: Path, args: list[str], invoke_run: InvokeRun,
                  pr: PointResult, on_status: Callable[[str], None], arm: Callable[[], None],
                  spans: SpanCapture | None, repeats: range) -> bool:
    assert plan.serve is not None
    port = free_port()
    values = {"port": str(port), **({"model": plan.model} if plan.model else {}), **point.placeholders(),
              **({OTLP_FIELD: spans.traces_url} if spans else {})}
    pr.command = substitute(plan.serve, values)
    # `itlbench run` wants an empty run directory: the log waits beside it and moves in when the server stops
    server = ServedServer(pr.command, port, point_dir.parent / f".{point.dirname}.server.log", plan.serve_timeout_s)
    log_name = "server.log" if len(repeats) == plan.repeat else f"server-run{repeats.start}.log"
    on_status(f"  server: {pr.command}")
    try:
        with server:
            return _runs_of_point(plan, point, point_dir, [*args, "--endpoint", server.base_url], invoke_run, pr,
                                  server, on_status, arm, spans, repeats)
    except ServerFailed as exc:
        pr.fail(exc.reason)
        on_status(f"  point {point.dirname} failed: {exc.reason}; its log: {point_dir / log_name}")
        if exc.log_tail:
            on_status("  " + tail(server.log_path, 3).replace("\n", "\n  "))
        return True
    finally:
        if server.log_path.is_file():
            point_dir.mkdir(parents=True, exist_ok=True)
            server.log_path.replace(point_dir / log_name)


def _write_manifest(plan: SweepPlan, result: SweepResult, out_dir: Path) -> None:
    make_dir(out_dir)
    doc = {"axes": {a.name: list(a.values) for a in plan.axes}, "repeat": plan.repeat, "order": plan.order,
           "serve": plan.serve,
           "repeat_seeds": None if plan.first_seed is None else [plan.first_seed + i for i in range(plan.repeat)],
           "interrupted": result.interrupted, "not_run": [p.point.dirname for p in result.points
                                                          if p.status == NOT_RUN],
           "points": [p.as_dict(out_dir) for p in result.points]}
    (out_dir / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")


def _labels(points: list[PointResult]) -> str:
    names = [p.point.label for p in points]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def interrupted_line(result: SweepResult) -> str:
    """The sweep's interruption in one sentence: where, and which points did not run."""
    cut = result.cut
    last = next((p for p in reversed(result.points) if p.status not in (NOT_RUN, RUNNING)), None)
    where = f" during {cut.point.label}" if cut else f" after {last.point.label}" if last else ""
    not_run = [p for p in result.points if p.status == NOT_RUN]
    rest = (f"{len(not_run)} of {len(result.points)} points did not run ({_labels(not_run)})" if not_run
            else "every point had started")
    return f"Sweep interrupted (Ctrl-C or SIGTERM){where}: {rest}."


def missing_lines(result: SweepResult) -> list[str]:
    """The interruption, then one sentence per point not measured whole, for the comparison's verdict."""
    out = [interrupted_line(result)] if result.interrupted else []
    for p in result.missing:
        log = f" (its {p.server_logs[-1].name} is in {p.dir})" if p.server_logs else ""
        if p.status == INTERRUPTED:
            out.append(f"Point {p.point.label} was {p.reason}{log}.")
        elif p.status == FAILED:
            out.append(f"Missing point {p.point.label}: {p.reason}{log}.")
        else:
            out.append(f"Missing point {p.point.label}: it did not run (the sweep was interrupted first).")
    return out


def order_notes(result: SweepResult) -> list[str]:
    """What the order of the repeats means for the verdict: said where they ran grouped."""
    if result.order != GROUPED or result.repeat == 1:
        return []
    return ["Repeats ran grouped (point after point, one server each): a machine that drifted over the sweep can "
            "read as a difference between points; --order interleaved runs them in rounds to balance it."]


class SweepAborted(Exception):
    """The first run rejected its options (it printed why); the sweep exits with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"run exited with {code}")
        self.code = code
