"""`itlbench capacity`: the highest load at which every SLO holds and no stream freezes beyond a stall budget.

The search doubles the load from `--start` until a point misses (bracketing), then bisects between the
highest point met and the lowest missed until they are within `--resolution` of each other (streams:
one apart). Points inside the bracket are the ones near the boundary, so each runs `--repeat` times and
counts as met only when every repeat meets (the answer must hold when re-run); the answer is re-run
too before it is reported. Every run is an ordinary `itlbench run` into `<dir>/<axis><load>[/runN]`.
The rate axis is the nominal --rate; where the answer's windows offered well below it, the verdict says what
they offered (capacity_offered.py).

A point meets when: no request failed, every `--slo` target holds (the same checks as `compare`'s
verdict), and the stall budget holds: the worst gap of any steady stream (`worst=`), the stalled time as
a share of the steady streams' streaming time (`stalled=`), and the share of the streamed requests
with at least one stall (`victims=`, the stall analysis's victims).

A miss the run's own validity checks put in doubt (the summary says `valid: false` and every figure
missed is one they name as affected: the client paused or read late, so ITL and stalls may be its
doing) is not taken as the server's: that run is kept, marked disturbed, and run again, at most
`DISTURBED_RERUNS` times a point. A shared 2-core box stalls client and server together now and then;
once in a full test run, a search answered 2 streams for a test server built to hold 3.

A run whose ITL the validity checks withdrew as never measured (the tokens arrived together, capacity_judge.py)
is *not judged* on the checks resting on it: no rerun (the server delivers so at that load), and the point
cannot meet unless ITL is measured, so it bounds the search from above as a miss does, but it is not called a
miss: `missed_at` is the lowest load measured to miss, `not_judged_at` the lowest not judged below it, and the
answer says above what load the capacity is not known and why.

A point whose window held no request measured nothing: below it there is still less to measure, so the
search stops there and says the window is too short for that load (a longer --duration), instead of
halving on. Ctrl-C or SIGTERM ends the search with what it had established (`interrupted`), the point
cut short kept beside the others. The simulator has no noise of its own, so with `--engine sim` a
point's runs take seeds seed, seed+1, … (as `sweep --repeat` does): a point meets for several loads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlbench.analysis.goodput import parse_slo
from itlbench.errors import EXIT_ENDED_EARLY, ConfigError
from itlbench.experiments.capacity_judge import RunJudgement, StallBudget
from itlbench.experiments.capacity_offered import load_unit, offered_doc, offered_tag, point_offered

InvokeRun = Callable[[list[str]], int]


DISTURBED_RERUNS = 2  # runs again of a point whose miss the client's validity checks put in doubt


def measure_point(load: float, phase: str, repeats: int, run_once: Callable[[], RunJudgement],
                  reruns: int = DISTURBED_RERUNS) -> SearchPoint:
    """`repeats` judged runs at one load; a disturbed run is run again (at most `reruns` times)."""
    pt = SearchPoint(load, phase)
    try:
        while len(pt.counted) < repeats:
            judged = run_once()
            pt.runs.append(judged)
            if judged.disturbed and reruns > 0:
                judged.rerun = True
                reruns -= 1
            if judged.empty:  # more runs at this load measure nothing either
                break
    except SearchInterrupted as exc:
        if exc.run is not None:
            pt.runs.append(exc.run)
        raise SearchInterrupted(point=pt) from exc
    except KeyboardInterrupt as exc:
        raise SearchInterrupted(point=pt) from exc
    return pt


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a point: `run` is the run it cut short (if it recorded one), `point` the point
    with the runs it had, so the search keeps both."""

    def __init__(self, run: RunJudgement | None = None, point: SearchPoint | None = None) -> None:
        super().__init__("interrupted")
        if run is not None:
            run.interrupted = True
        self.run, self.point = run, point


class SearchStopped(Exception):
    """A run at some load left nothing to judge (it wrote nothing): the search ends there, `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class SearchPoint:
    load: float
    phase: str  # bracket, bisect, confirm
    runs: list[RunJudgement] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C cut it short: its runs are kept, its verdict is not the search's

    @property
    def counted(self) -> list[RunJudgement]:
        """The runs the verdict rests on: all but the disturbed ones run again and those cut short."""
        return [r for r in self.runs if not r.rerun and not r.interrupted]

    @property
    def met(self) -> bool:
        return bool(self.counted) and all(r.met for r in self.counted)

    @property
    def missed(self) -> bool:
        """A counted run missed on a figure it measured: the load does not hold, whatever else went unjudged."""
        return any(r.misses for r in self.counted)

    @property
    def not_judged(self) -> bool:
        """No counted run missed, but one could not be judged (its ITL was never measured): neither met nor missed."""
        return not self.missed and any(r.not_judged for r in self.counted)

    @property
    def unmeasured(self) -> list[str]:
        """Why its runs' checks went unjudged (the validity reasons, each once)."""
        return list(dict.fromkeys(u for r in self.counted for u in r.unmeasured))

    @property
    def empty(self) -> bool:
        """Every counted run's window held no request: the point measured nothing."""
        return bool(self.counted) and all(r.empty for r in self.counted)

    @property
    def not_judged_note(self) -> str:
        """'not judged (ITL p99): tokens arrived together (80% of 1,937 gaps are 0)': which checks, why in brief."""
        checks = ", ".join(dict.fromkeys(c for r in self.counted for c in r.not_judged))
        return f"not judged ({checks}): " + "; ".join(u.split(": ")[0] for u in self.unmeasured)

    def as_dict(self, root: Path) -> dict[str, Any]:
        return {"load": self.load, "phase": self.phase, "met": self.met, "not_judged": self.not_judged,
                "unmeasured": self.unmeasured, "measured_nothing": self.empty,
                "interrupted": self.interrupted, "offered_rps": point_offered(self),
                "runs": [{"run_dir": str(r.run_dir.relative_to(root)), "met": r.met, "misses": r.misses,
                          "not_judged": r.not_judged, "unmeasured": r.unmeasured,
                          "figures": r.figures, "disturbed": r.disturbed, "rerun": r.rerun,
                          "interrupted": r.interrupted, "seed": r.seed} for r in self.runs]}


# what the search may vary: --rate (arrivals/s), --streams (closed loop), or --time-scale (a trace's own
# arrivals replayed faster or slower: a trace has no --rate to set)
AXES = ("rate", "streams", "time-scale")


@dataclass
class CapacityPlan:
    axis: str = "rate"
    start: float = 1.0
    load_max: float | None = None
    resolution: float = 0.1
    repeat: int = 2
    max_points: int = 14
    slo: str | None = None
    budget: StallBudget = field(default_factory=StallBudget)

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ConfigError("--axis", f"unknown axis {self.axis!r}", "use rate, streams or time-scale (a --trace "
                              "replay's speed)")
        if not self.start > 0 or (self.axis == "streams" and self.start != int(self.start)):
            raise ConfigError("--start", f"must be a positive {'integer' if self.axis == 'streams' else 'number'}, "
                              f"got {self.start:g}", "e.g. --start 1")
        if self.load_max is not None and self.load_max < self.start:
            raise ConfigError("--rate-max", f"{self.load_max:g} is below --start {self.start:g}", "raise it")
        if self.max_points < 1:
            raise ConfigError("--max-points", f"must be ≥ 1, got {self.max_points}", "e.g. --max-points 14")
        if not 0 < self.resolution < 1:
            raise ConfigError("--resolution", f"must be between 0 and 1, got {self.resolution:g}", "e.g. 0.1")
        if self.repeat < 1:
            raise ConfigError("--repeat", f"must be ≥ 1, got {self.repeat}", "e.g. --repeat 2")
        parse_slo(self.slo)

    def fmt(self, load: float) -> str:
        return str(int(load)) if self.axis == "streams" else f"{load:.4g}"


@dataclass
class CapacityResult:
    plan: CapacityPlan
    points: list[SearchPoint]
    max_load: float | None  # the highest load met (None: even the lowest tried missed)
    missed_at: float | None  # the lowest load measured to miss (None: held up to load_max, or none measured)
    interrupted: bool = False
    interrupted_at: float | None = None  # the load whose point Ctrl-C cut short
    stopped: str | None = None  # why the search ended before it had an answer (a point measured nothing)
    not_judged_at: float | None = None  # the lowest load not judged (ITL never measured) below missed_at

    @property
    def exit_code(self) -> int:
        """130 interrupted; 0 a capacity was found; 1 none was, or the search ended early (a point measured
        nothing, a run wrote nothing): a script tells an answer from none without reading capacity.json."""
        if self.interrupted:
            return 130
        return 0 if self.max_load is not None and self.stopped is None else EXIT_ENDED_EARLY

    @property
    def inversions(self) -> list[tuple[float, float]]:
        """(met, missed) pairs where a load met above one that missed: the noise exceeds the boundary's slope."""
        met = [p.load for p in self.points if p.met and not p.interrupted]
        missed = [p.load for p in self.points if p.missed and not p.empty]
        return sorted({(m, x) for m in met for x in missed if m > x})

    @property
    def unit(self) -> str:
        """What the load counts: requests/s, sessions/s (agent sessions arriving at --rate) or streams."""
        return load_unit(self.plan.axis, [r for p in self.points for r in p.runs])

    @property
    def confirmed(self) -> bool:
        """The answer ran `repeat` times, every run meeting (False where --max-points cut the search short)."""
        runs = [r for p in self.points if p.load == self.max_load for r in p.counted]
        return self.max_load is not None and len(runs) >= self.plan.repeat and all(r.met for r in runs)

    @property
    def not_judged_why(self) -> list[str]:
        """Why the point at `not_judged_at` went unjudged (its runs' validity reasons)."""
        return list(dict.fromkeys(u for p in self.points if p.load == self.not_judged_at and p.not_judged
                                  for u in p.unmeasured))

    def as_dict(self, root: Path) -> dict[str, Any]:
        p = self.plan
        key = f"max_{p.axis.replace('-', '_')}"
        return {key: self.max_load, "axis": p.axis, "missed_at": self.missed_at, "not_judged_at": self.not_judged_at,
                "not_judged_why": self.not_judged_why,
                "margin": None if self.max_load is None or self.missed_at is None else self.missed_at - self.max_load,
                "slo": p.slo, "stall_budget": p.budget.as_dict(), "resolution": p.resolution, "repeat": p.repeat,
                "confirmed": self.confirmed, "monotone": not self.inversions, "interrupted": self.interrupted,
                "interrupted_at": self.interrupted_at, "stopped": self.stopped, "unit": self.unit, **offered_doc(self),
                "points": [pt.as_dict(root) for pt in self.points]}


def _next_down(plan: CapacityPlan, load: float) -> float | None:
    nxt = load / 2
    if plan.axis == "streams":
        nxt = math.floor(nxt)
    return nxt if nxt >= (1 if plan.axis == "streams" else plan.start / 64) else None


def _mid(plan: CapacityPlan, lo: float, hi: float) -> float | None:
    """The next bisection point, or None once lo and hi are within the resolution."""
    if plan.axis == "streams":
        return None if hi - lo <= 1 else float((int(lo) + int(hi)) // 2)
    return None if (hi - lo) <= plan.resolution * lo else (lo + hi) / 2


def too_short(plan: CapacityPlan, pt: SearchPoint) -> str:
    """Why a point with no request in its window ends the search, and the --duration that would measure it."""
    window = max((r.figures.get("window_s") or 0.0 for r in pt.counted), default=0.0)
    span = f"{window:g} s measured window" if window else "measured window"
    unit = load_unit(plan.axis, pt.counted)
    hint = f", e.g. --duration {math.ceil(10 / pt.load)}s for about 10 {unit.split('/')[0]}" if plan.axis == "rate" else ""
    return (f"at {plan.fmt(pt.load)} {unit} the {span} held no request, too short for that load: the search "
            f"stopped there, as lower loads would measure nothing either (give a longer --duration{hint})")


def search(plan: CapacityPlan, measure: Callable[[float, str, int], SearchPoint],
           on_status: Callable[[str], None] = lambda s: None) -> CapacityResult:
    """Bracket, bisect, confirm. `measure(load, phase, repeats)` runs a point and judges it. A point that
    measured nothing stops the search (`stopped`); Ctrl-C returns what was established (`interrupted`)."""
    points: list[SearchPoint] = []
    lo: float | None = None
    hi: float | None = None
    at: list[float] = []  # the load being measured

    def run(load: float, phase: str, repeats: int) -> bool:
        at.append(load)
        pt = measure(load, phase, repeats)
        points.append(pt)
        if pt.empty:
            on_status(f"{plan.axis} {plan.fmt(load)} ({phase}): measured nothing (no request in its window)")
            raise SearchStopped(too_short(plan, pt))
        word = "met" if pt.met else "missed: " + "; ".join(next((r.misses for r in pt.counted if r.misses), []))[:160]
        if pt.not_judged:
            word = pt.not_judged_note
        on_status(f"{plan.axis} {plan.fmt(load)} ({phase}{offered_tag(pt)}): {word}")
        return pt.met

    load: float | None = plan.start
    try:
        while load is not None and len(points) < plan.max_points:  # bracketing: double until a miss
            if not run(load, "bracket", 1):
                hi = load
                break
            lo = load
            if plan.load_max is not None and load >= plan.load_max:
                break
            load = load * 2 if plan.load_max is None else min(load * 2, plan.load_max)
        if lo is None and hi is not None:  # even the start missed: halve until a point meets
            load = _next_down(plan, hi)
            while load is not None and len(points) < plan.max_points:
                if run(load, "bracket", 1):
                    lo = load
                    break
                hi = load
                load = _next_down(plan, load)
        while lo is not None and len(points) < plan.max_points:  # bisection (within a bracket), then confirm
            mid = None if hi is None else _mid(plan, lo, hi)
            if mid is not None:
                if run(mid, "bisect", plan.repeat):
                    lo = mid
                else:
                    hi = mid
                continue
            confirmed = sum(len(p.counted) for p in points if p.load == lo)
            if confirmed >= plan.repeat:
                break
            if run(lo, "confirm", plan.repeat - confirmed) and all(p.met for p in points if p.load == lo):
                break
            hi = lo
            lower = [p.load for p in points if p.met and p.load < lo]
            lo = max(lower) if lower else None
    except SearchStopped as exc:
        return _ended(plan, points, lo, hi, stopped=exc.reason)
    except KeyboardInterrupt as exc:
        cut = exc.point if isinstance(exc, SearchInterrupted) else None
        if cut is not None and cut.runs:
            cut.interrupted = True
            points.append(cut)
        return _ended(plan, points, lo, hi, interrupted=True, interrupted_at=at[-1] if at else None)
    return _ended(plan, points, lo, hi)


def _ended(plan: CapacityPlan, points: list[SearchPoint], lo: float | None, hi: float | None,
           **how: Any) -> CapacityResult:
    """The result of a search whose bracket ended at (lo, hi): `hi` bounds it from above, missed or not judged, so
    `missed_at` is the lowest load at or above it measured to miss, `not_judged_at` the lowest not judged below that."""
    def lowest(keep: Callable[[SearchPoint], bool]) -> float | None:
        loads = [p.load for p in points if hi is not None and p.load >= hi and not p.interrupted and not p.empty
                 and keep(p)]
        return min(loads, default=None)

    missed = lowest(lambda p: p.missed)
    unjudged = lowest(lambda p: p.not_judged and (missed is None or p.load < missed))
    return CapacityResult(plan, points, lo, missed, not_judged_at=unjudged, **how)


def write_capacity_json(result: CapacityResult, out_dir: Path) -> Path:
    path = out_dir / "capacity.json"
    path.write_text(json.dumps(result.as_dict(out_dir), indent=2, default=str) + "\n")
    return path
