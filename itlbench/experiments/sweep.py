"""`itlbench sweep`: the same seeded workload once per point (budget, policy, load, …), then one comparison.

Each point runs through `itlbench run` itself with the user's run options, into `<sweep dir>/<point>/`
(`…/<point>/run1…N` with `--repeat N`), so a sweep's runs are ordinary runs (each with its own report)
and `itlbench compare` can re-read them. With `--serve 'CMD'` each point gets its own server from the
command template (see served.py), measured as an `--endpoint`; a point whose server fails is recorded
in `sweep.json` with its log and the sweep goes on. A run stopped by Ctrl-C or SIGTERM ends the sweep
(its server is stopped first); the comparison still covers the finished points.
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


@dataclass
class SweepPlan:
    """What to run: the points, how often each, and (optionally) the server command template."""

    axes: list[Axis]
    repeat: int = 1
    serve: str | None = None
    serve_timeout_s: float = 600.0
    model: str | None = None
    otlp: bool = False  # --receive-otlp: {otlp_endpoint} may appear in the template

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
    """One point's outcome: its finished run directories, or why it has none."""

    point: Point
    dir: Path
    runs: list[Path] = field(default_factory=list)
    failed: str | None = None
    command: str | None = None

    def as_dict(self, root: Path) -> dict[str, Any]:
        log = self.dir / "server.log"
        return {"point": self.point.dirname, "label": self.point.label, "settings": self.point.as_dict(),
                "status": "failed" if self.failed else "ok", "reason": self.failed,
                "runs": [str(r.relative_to(root)) for r in self.runs], "serve_command": self.command,
                "server_log": str(log.relative_to(root)) if log.is_file() else None}


@dataclass
class SweepResult:
    points: list[PointResult]
    interrupted: bool = False

    @property
    def run_dirs(self) -> list[Path]:
        return [r for p in self.points for r in p.runs]

    @property
    def missing(self) -> list[PointResult]:
        return [p for p in self.points if p.failed or not p.runs]


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


def annotate_run(run_dir: Path, point: Point, repeat: int, of: int, command: str | None) -> None:
    """Record in run.json which sweep point this run measured (and the server command it ran against)."""
    path = run_dir / "run.json"
    doc = read_json(path)
    if doc is None:
        return
    doc["sweep"] = {"point": point.dirname, "label": point.label, "settings": point.as_dict(),
                    "repeat": repeat, "repeats": of}
    if command is not None:
        doc["sweep"]["serve_command"] = command
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def _runs_of_point(plan: SweepPlan, point: Point, point_dir: Path, args: list[str], invoke_run: InvokeRun,
                   result: PointResult, server: ServedServer | None, on_status: Callable[[str], None],
                   arm: Callable[[], None], spans: SpanCapture | None = None) -> bool:
    """The point's repeats; False when the sweep must stop (a run was interrupted or refused its options)."""
    for i in range(1, plan.repeat + 1):
        run_dir = point_dir if plan.repeat == 1 else point_dir / f"run{i}"
        if plan.repeat > 1:
            on_status(f"  repeat {i}/{plan.repeat}")
        code = invoke_run([*args, "--out", str(run_dir)])
        arm()
        if (run_dir / "run.json").is_file():
            annotate_run(run_dir, point, i, plan.repeat, result.command)
            save_and_warn(spans, run_dir, on_status)
            result.runs.append(run_dir)
        if server is not None and server.died() is not None:
            result.failed = f"the server exited with code {server.died()} during the run"
            return True
        if code == 2 and not result.runs:
            raise SweepAborted(code)
        if code not in (0, EXIT_ENDED_EARLY) or stopped_early(run_dir):  # an aborted point's records still count
            return False
    return True


def run_sweep(plan: SweepPlan, run_args: list[str], out_dir: Path, invoke_run: InvokeRun,
              on_status: Callable[[str], None] = lambda s: None, spans: SpanCapture | None = None) -> SweepResult:
    """Run every point (in order) into out_dir/<point>; writes sweep.json as it goes.
    `invoke_run(args)` runs `itlbench run args` and returns its exit code; `spans` (--receive-otlp) fills
    {otlp_endpoint} and takes each run's spans into its directory."""
    check_run_args(run_args, plan.serve is not None)
    points = plan.points
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError("--out", f"{out_dir} already holds files", "choose a new directory")
    result = SweepResult([])
    with terminate_as_interrupt() as arm:
        try:
            for n, point in enumerate(points, 1):
                on_status(f"sweep {n}/{len(points)}: {point.dirname}")
                point_dir = out_dir / point.dirname
                pr = PointResult(point, point_dir)
                result.points.append(pr)
                args = [*run_args, *point.run_args(served=plan.serve is not None)]
                try:
                    if plan.serve is None:
                        go_on = _runs_of_point(plan, point, point_dir, args, invoke_run, pr, None, on_status, arm,
                                               spans)
                    else:
                        go_on = _served_point(plan, point, point_dir, args, invoke_run, pr, on_status, arm, spans)
                except SweepAborted:
                    if n == 1:
                        _remove_if_empty(out_dir)
                        raise
                    go_on = False
                _write_manifest(plan, result, out_dir)
                if not go_on:
                    on_status(f"sweep stopped after {point.dirname}")
                    result.interrupted = True
                    break
        except KeyboardInterrupt:
            result.interrupted = True
            on_status("sweep interrupted; the point's server is stopped")
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
        pr.failed = exc.reason
        on_status(f"  point {point.dirname} failed: {exc.reason}; its log: {point_dir / 'server.log'}")
        if exc.log_tail:
            on_status("  " + tail(server.log_path, 3).replace("\n", "\n  "))
        return True
    finally:
        if server.log_path.is_file():
            point_dir.mkdir(parents=True, exist_ok=True)
            server.log_path.replace(point_dir / "server.log")
        if pr.failed is None and not pr.runs:
            pr.failed = "no run finished against the server (the run's error is above)"


def _remove_if_empty(path: Path) -> None:
    for sub in sorted(path.rglob("*"), reverse=True) if path.exists() else []:
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if path.exists() and not any(path.iterdir()):
        path.rmdir()


def _write_manifest(plan: SweepPlan, result: SweepResult, out_dir: Path) -> None:
    make_dir(out_dir)
    doc = {"axes": {a.name: list(a.values) for a in plan.axes}, "repeat": plan.repeat, "serve": plan.serve,
           "interrupted": result.interrupted, "points": [p.as_dict(out_dir) for p in result.points]}
    (out_dir / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")


def missing_lines(result: SweepResult) -> list[str]:
    """One sentence per point with no finished run, for the comparison's verdict."""
    out = []
    for p in result.missing:
        why = p.failed or "it did not run (the sweep stopped first)"
        log = " (its server.log is in " + str(p.dir) + ")" if (p.dir / "server.log").is_file() else ""
        out.append(f"Missing point {p.point.label}: {why}{log}.")
    return out


class SweepAborted(Exception):
    """The first run rejected its options (it printed why); the sweep exits with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"run exited with {code}")
        self.code = code
