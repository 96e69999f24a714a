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

The simulator on its virtual clock has no noise: repeats of one seed give identical figures, and a
95 % interval over them is a point. So with `--engine sim` repeat k runs seed + k - 1 (each run's
seed is in its run.json): the spread is the load's, as docs/simulator.md says.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlbench.errors import EXIT_ENDED_EARLY, ConfigError
from itlbench.experiments.points import Axis, Point, grid
from itlbench.experiments.served import (
    OTLP_FIELD,
    ServedServer,
    ServerFailed,
    check_template,
    free_port,
    substitute,
    tail,
)
from itlbench.report.data import read_json
from itlbench.rundir.outdir import make_dir
from itlbench.telemetry.span_capture import SpanCapture, save_and_warn

OWNED_FLAGS = ("--chunk-budget", "--policy", "--out", "--max-num-seqs")
InvokeRun = Callable[[list[str]], int]
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130  # `itlbench run`'s statuses for refused options and Ctrl-C
OK, INTERRUPTED, FAILED, NOT_RUN, RUNNING = "ok", "interrupted", "failed", "not run", "running"


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

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ConfigError("--repeat", f"must be ≥ 1, got {self.repeat}", "e.g. --repeat 3")
        if self.serve is not None:
            check_template(self.serve, [a.name for a in self.axes if a.name not in ("rate", "streams")], self.otlp)
        elif any(a.user for a in self.axes):
            raise ConfigError("--set", "only a --serve template knows what a setting of your own means",
                              "add --serve 'CMD … {name} …', or sweep an itlbench flag")

    @property
    def points(self) -> list[Point]:
        return grid(self.axes)


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

    def as_dict(self, root: Path) -> dict[str, Any]:
        log = self.dir / "server.log"
        return {"point": self.point.dirname, "label": self.point.label, "settings": self.point.as_dict(),
                "status": self.status, "reason": self.reason,
                "runs": [str(r.relative_to(root)) for r in self.runs],
                "partial_runs": [str(r.relative_to(root)) for r in self.partial],
                "seeds": self.seeds or None, "serve_command": self.command,
                "server_log": str(log.relative_to(root)) if log.is_file() else None}


@dataclass
class SweepResult:
    points: list[PointResult]
    interrupted: bool = False

    @property
    def run_dirs(self) -> list[Path]:
        """The finished runs, which the comparison covers."""
        return [r for p in self.points for r in p.runs]

    @property
    def missing(self) -> list[PointResult]:
        return [p for p in self.points if p.status != OK]


def check_run_args(args: Sequence[str], served: bool) -> None:
    for flag in (*OWNED_FLAGS, "--endpoint"):
        if any(a == flag or a.startswith(flag + "=") for a in args):
            if flag == "--endpoint":
                raise ConfigError("--endpoint", "a sweep restarts the engine for every point",
                                  "give the server's start command as --serve 'CMD --port {port} …', or measure "
                                  "a running server with `itlbench run --endpoint` and `itlbench compare`")
            raise ConfigError(flag, "is set by the sweep itself", "give it to `itlbench sweep`, not as a run option")
    if served and _flag_value(args, "--engine") is not None:
        raise ConfigError("--engine", "is the served command's business with --serve", "put it in the template")


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def repeat_seed(args: Sequence[str], served: bool) -> int | None:
    """The first repeat's seed where repeats must vary it (the bundled simulator: it has no noise of its own,
    so repeats of one seed are one run), else None (repeats keep the seed; the machine gives the spread)."""
    if served or _flag_value(args, "--engine") != "sim":
        return None
    text = _flag_value(args, "--seed")
    try:
        return 0 if text is None else int(text)
    except ValueError:
        raise ConfigError("--seed", f"cannot read {text!r} as a whole number", "e.g. --seed 7") from None


def with_seed(args: Sequence[str], seed: int) -> list[str]:
    """`args` with `--seed` set to `seed` (the user's own --seed taken out, not given twice)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--seed":
            skip = True
        elif not a.startswith("--seed="):
            out.append(a)
    return [*out, "--seed", str(seed)]


def default_sweep_dir(args: Sequence[str], reports_dir: Path = Path("reports"), kind: str = "sweep") -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    parts = [stamp, kind, _flag_value(args, "--workload") or "chat"]
    inject = _flag_value(args, "--inject")
    if inject:
        parts.append("inj" + re.sub(r"[^0-9a-zA-Z]+", "_", inject))
    return reports_dir / "-".join(parts)


def stopped_early(run_dir: Path) -> bool:
    doc = read_json(run_dir / "run.json") or {}
    return bool(doc.get("interrupted")) or doc.get("stop_reason") in ("stop_event", "interrupted")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[Callable[[], None]]:
    """SIGTERM raises KeyboardInterrupt (so `finally` stops the point's server) until the block ends; the
    yielded function re-arms it after a run, whose event loop resets SIGTERM to the default on leaving."""
    previous = signal.getsignal(signal.SIGTERM)

    def arm() -> None:
        with contextlib.suppress(ValueError):  # not the main thread: nothing to arm
            signal.signal(signal.SIGTERM, _raise_interrupt)

    arm()
    try:
        yield arm
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)


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
                   arm: Callable[[], None], spans: SpanCapture | None = None) -> bool:
    """The point's repeats, setting its status; False when the sweep must stop (a run was interrupted)."""
    for i in range(1, plan.repeat + 1):
        run_dir = point_dir if plan.repeat == 1 else point_dir / f"run{i}"
        if plan.repeat > 1:
            on_status(f"  repeat {i}/{plan.repeat}")
        seed = None if plan.first_seed is None else plan.first_seed + i - 1
        code = invoke_run([*(args if seed is None else with_seed(args, seed)), "--out", str(run_dir)])
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
    result.status = OK
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
    result = SweepResult([PointResult(p, out_dir / p.dirname) for p in points])
    current: PointResult | None = None
    with terminate_as_interrupt() as arm:
        try:
            _write_manifest(plan, result, out_dir)
            for n, pr in enumerate(result.points, 1):
                current, pr.status = pr, RUNNING
                on_status(f"sweep {n}/{len(points)}: {pr.point.dirname}")
                args = [*run_args, *pr.point.run_args(served=plan.serve is not None)]
                try:
                    if plan.serve is None:
                        go_on = _runs_of_point(plan, pr.point, pr.dir, args, invoke_run, pr, None, on_status, arm,
                                               spans)
                    else:
                        go_on = _served_point(plan, pr.point, pr.dir, args, invoke_run, pr, on_status, arm, spans)
                except SweepAborted:
                    if n == 1:
                        (out_dir / "sweep.json").unlink(missing_ok=True)
                        remove_if_empty(out_dir)
                        raise
                    pr.fail("its run refused the options (exit 2; its error is above)")
                    go_on = True
                current = None
                _write_manifest(plan, result, out_dir)
                if not go_on:
                    result.interrupted = True
                    break
        except KeyboardInterrupt:  # outside a run (between runs, a server starting or stopping)
            result.interrupted = True
            if current is not None and current.status == RUNNING:
                current.interrupt("interrupted before its run finished"
                                  + (": its records are kept, left out of the comparison" if current.partial else ""))
    if out_dir.exists():
        _write_manifest(plan, result, out_dir)
    return result


def _served_point(plan: SweepPlan, point: Point, point_dir: Path, args: list[str], invoke_run: InvokeRun,
                  pr: PointResult, on_status: Callable[[str], None], arm: Callable[[], None],
                  spans: SpanCapture | None) -> bool:
    assert plan.serve is not None
    port = free_port()
    values = {"port": str(port), **({"model": plan.model} if plan.model else {}), **point.placeholders(),
              **({OTLP_FIELD: spans.traces_url} if spans else {})}
    pr.command = substitute(plan.serve, values)
    # `itlbench run` wants an empty run directory: the log waits beside it and moves in when the server stops
    server = ServedServer(pr.command, port, point_dir.parent / f".{point.dirname}.server.log", plan.serve_timeout_s)
    on_status(f"  server: {pr.command}")
    try:
        with server:
            return _runs_of_point(plan, point, point_dir, [*args, "--endpoint", server.base_url], invoke_run, pr,
                                  server, on_status, arm, spans)
    except ServerFailed as exc:
        pr.fail(exc.reason)
        on_status(f"  point {point.dirname} failed: {exc.reason}; its log: {point_dir / 'server.log'}")
        if exc.log_tail:
            on_status("  " + tail(server.log_path, 3).replace("\n", "\n  "))
        return True
    finally:
        if server.log_path.is_file():
            point_dir.mkdir(parents=True, exist_ok=True)
            server.log_path.replace(point_dir / "server.log")


def remove_if_empty(path: Path) -> None:
    """Bad input found by the first run: the empty directories made for it go (any file stays)."""
    for sub in sorted(path.rglob("*"), reverse=True) if path.exists() else []:
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if path.exists() and not any(path.iterdir()):
        path.rmdir()


def _write_manifest(plan: SweepPlan, result: SweepResult, out_dir: Path) -> None:
    make_dir(out_dir)
    doc = {"axes": {a.name: list(a.values) for a in plan.axes}, "repeat": plan.repeat, "serve": plan.serve,
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
    cut = next((p for p in result.points if p.status == INTERRUPTED), None)
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
        log = " (its server.log is in " + str(p.dir) + ")" if (p.dir / "server.log").is_file() else ""
        if p.status == INTERRUPTED:
            out.append(f"Point {p.point.label} was {p.reason}{log}.")
        elif p.status == FAILED:
            out.append(f"Missing point {p.point.label}: {p.reason}{log}.")
        else:
            out.append(f"Missing point {p.point.label}: it did not run (the sweep was interrupted first).")
    return out


class SweepAborted(Exception):
    """The first run rejected its options (it printed why); the sweep exits with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"run exited with {code}")
        self.code = code
