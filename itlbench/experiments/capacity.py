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

import polars as pl

from itlbench.analysis.goodput import parse_slo
from itlbench.errors import EXIT_ENDED_EARLY, ConfigError
from itlbench.experiments.capacity_offered import load_unit, offered_doc, offered_tag, point_offered
from itlbench.report.data import load_run
from itlbench.units import parse_duration_s

InvokeRun = Callable[[list[str]], int]


@dataclass(frozen=True)
class StallBudget:
    """How much freezing a point may show: the worst gap (s), stalled share of stream time, stalled streams."""

    worst_s: float | None = None
    stalled: float | None = None
    victims: float | None = None
    spec: str = ""

    def as_dict(self) -> dict[str, float | str | None]:
        return {"worst_s": self.worst_s, "stalled": self.stalled, "victims": self.victims, "spec": self.spec}


def _share(item: str, text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise ConfigError("--stall-budget", f"{item!r}: {text!r} is not a share", "write it as 1% or 0.01")
    return value


def parse_stall_budget(spec: str | None) -> StallBudget:
    """'worst=1s,stalled=1%,victims=10%' (any subset) → StallBudget; bad items name --stall-budget."""
    if not spec:
        return StallBudget()
    out: dict[str, float] = {}
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("worst", "stalled", "victims"):
            raise ConfigError("--stall-budget", f"{item!r} is not worst=DUR, stalled=SHARE or victims=SHARE",
                              "e.g. --stall-budget worst=1s,stalled=1%,victims=10%")
        out[key] = parse_duration_s(value.strip(), "--stall-budget") if key == "worst" else _share(item, value.strip())
    return StallBudget(out.get("worst"), out.get("stalled"), out.get("victims"), spec)


DISTURBED_RERUNS = 2  # runs again of a point whose miss the client's validity checks put in doubt


@dataclass
class RunJudgement:
    """One run at one load: its headline figures, whether it met, and what it missed.

    `disturbed` holds the run's validity reasons when every miss is on a figure they affect; `rerun`
    is set once another run has taken its place in the point's verdict."""

    run_dir: Path
    figures: dict[str, float | None]
    misses: list[str]
    disturbed: list[str] = field(default_factory=list)
    rerun: bool = False
    interrupted: bool = False  # Ctrl-C or SIGTERM cut the run short: kept, never counted
    seed: int | None = None  # the seed it ran, where the search varies it (the simulator)
    queueing: str | None = None  # what held the requests that waited for the engine (report/queueing.py)
    rate_unit: str | None = None  # what --rate counted, as its summary's `offered.unit` says (req/s, sessions/s)

    @property
    def met(self) -> bool:
        return not self.misses

    @property
    def empty(self) -> bool:
        """No request in its window (and none failed): it measured nothing at all."""
        return self.figures.get("requests") == 0 and not self.figures.get("failed_requests")


def judge_run(run_dir: Path, slo: str | None, budget: StallBudget) -> RunJudgement:
    """A finished run against the SLOs and the stall budget (the compare verdict's checks, plus stalls)."""
    from itlbench.report.queueing import queueing_sentence
    from itlbench.report.slo_checks import slo_checks, worst_gap_s
    from itlbench.report.style import fmt_s

    run = load_run(run_dir)
    s = run.summary
    itl, stalls = s.get("itl_s") or {}, s.get("stalls") or {}
    spans = run.chunks.spans if run.chunks.spans is not None else pl.DataFrame(
        schema={"injected": pl.Boolean, "gaps": pl.Int64, "mean_s": pl.Float64})
    steady = spans.filter(~pl.col("injected"))  # per request: its gaps in the window and their mean
    stream_s = float((steady["gaps"] * steady["mean_s"]).sum()) if steady.height else 0.0
    streamed = spans.height  # requests that streamed; the stall analysis counts victims so
    requests = s.get("requests") or {}
    ttft_all = (s.get("ttft_s") or {}).get("all") or {}
    figures: dict[str, float | None] = {
        "itl_p50_s": itl.get("p50"), "itl_p99_s": itl.get("p99"), "worst_gap_s": worst_gap_s(s),
        "ttft_p90_s": ttft_all.get("p90") if ttft_all.get("p90") is not None else ttft_all.get("max"),
        "stalled_share": (stalls.get("stalled_s") or 0.0) / stream_s if stream_s else None,
        "victims_share": (stalls.get("victims") or 0) / streamed if streamed else None,
        "achieved_rps": (s.get("throughput") or {}).get("requests_per_s"),
        "output_tokens_per_s": (s.get("throughput") or {}).get("output_tokens_per_s"),
        "failed_requests": float((requests.get("error") or 0) + (requests.get("timeout") or 0)),
        "requests": float(requests.get("total") or 0), "window_s": run.window.seconds,
        **{k: (s.get("offered") or {}).get(k) for k in ("offered_rps", "arrivals", "expected_arrivals", "count_noise")}}
    missed: list[tuple[str, str]] = [  # (what, the summary figure it rests on)
        (f"{c.what} {fmt_s(c.value_s)} > {fmt_s(c.target_s)}", c.figure)
        for c in slo_checks(run, parse_slo(slo)) if not c.ok]
    if figures["failed_requests"]:
        missed.insert(0, (f"{figures['failed_requests']:.0f} requests failed", "requests"))
    if not figures["requests"]:
        missed.insert(0, ("no request finished", "requests"))
    worst = figures["worst_gap_s"]
    if budget.worst_s is not None and worst is not None and worst > budget.worst_s:
        missed.append((f"worst gap {fmt_s(worst)} > {fmt_s(budget.worst_s)}", "itl_s"))
    share = figures["stalled_share"]
    if budget.stalled is not None and share is not None and share > budget.stalled:
        missed.append((f"stalled {share:.1%} of stream time > {budget.stalled:.1%}", "stalls"))
    victims = figures["victims_share"]
    if budget.victims is not None and victims is not None and victims > budget.victims:
        missed.append((f"{victims:.0%} of requests stalled > {budget.victims:.0%}", "stalls"))
    return RunJudgement(run_dir, figures, [what for what, _ in missed], _doubted(s, [f for _, f in missed]),
                        queueing=queueing_sentence(s), rate_unit=(s.get("offered") or {}).get("unit"))


def _doubted(summary: dict[str, Any], missed_figures: list[str]) -> list[str]:
    """The run's validity reasons where every missed figure is one they affect; else []."""
    validity = summary.get("validity") or {}
    affected = set(validity.get("affected") or [])
    if summary.get("valid", True) or not missed_figures or not set(missed_figures) <= affected:
        return []
    return list(validity.get("reasons") or ["the run's validity checks failed"])


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
    def empty(self) -> bool:
        """Every counted run's window held no request: the point measured nothing."""
        return bool(self.counted) and all(r.empty for r in self.counted)

    def as_dict(self, root: Path) -> dict[str, Any]:
        return {"load": self.load, "phase": self.phase, "met": self.met, "measured_nothing": self.empty,
                "interrupted": self.interrupted, "offered_rps": point_offered(self),
                "runs": [{"run_dir": str(r.run_dir.relative_to(root)), "met": r.met, "misses": r.misses,
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
    missed_at: float | None  # the lowest load missed (None: held up to load_max)
    interrupted: bool = False
    interrupted_at: float | None = None  # the load whose point Ctrl-C cut short
    stopped: str | None = None  # why the search ended before it had an answer (a point measured nothing)

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
        missed = [p.load for p in self.points if p.counted and not p.met and not p.empty]
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

    def as_dict(self, root: Path) -> dict[str, Any]:
        p = self.plan
        key = f"max_{p.axis.replace('-', '_')}"
        return {key: self.max_load, "axis": p.axis, "missed_at": self.missed_at,
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
        return CapacityResult(plan, points, lo, hi, stopped=exc.reason)
    except KeyboardInterrupt as exc:
        cut = exc.point if isinstance(exc, SearchInterrupted) else None
        if cut is not None and cut.runs:
            cut.interrupted = True
            points.append(cut)
        return CapacityResult(plan, points, lo, hi, interrupted=True, interrupted_at=at[-1] if at else None)
    return CapacityResult(plan, points, lo, hi)


def write_capacity_json(result: CapacityResult, out_dir: Path) -> Path:
    path = out_dir / "capacity.json"
    path.write_text(json.dumps(result.as_dict(out_dir), indent=2, default=str) + "\n")
    return path
