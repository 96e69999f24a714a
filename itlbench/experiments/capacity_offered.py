"""What a rate search's points offered: the arrivals each run's window held, beside the nominal rate it was given.

The rate axis is the nominal `--rate`: the search sets it, and `itlbench run --rate` reproduces a point with it.
Every rate scales one seeded arrival sequence, so for one seed the offered rate rises with the nominal (the
points keep their order, and bisecting on the nominal finds the same boundary as bisecting on the offered rate
would). But the count in a short window is a Poisson count (analysis/offered.py): with 40 arrivals expected it
varies by ±16 %, and one draw may hold 26. Where the answer's runs offered more than SHORTFALL_NOTE below the
nominal, the verdict says so, states the capacity as what was offered too, and gives the --duration that offers
nearer the nominal rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from itlbench.analysis.offered import SHORTFALL_NOTE, TARGET_NOISE, fmt_rate, round_up_s, steady_duration_s


# What of capacity.py's records this module reads, as protocols: capacity.py imports this module, not the reverse.
class _Run(Protocol):
    @property
    def figures(self) -> dict[str, float | None]: ...

    @property
    def rate_unit(self) -> str | None: ...


class SearchPoint(Protocol):
    @property
    def load(self) -> float: ...

    @property
    def counted(self) -> Sequence[_Run]: ...


class _Plan(Protocol):
    @property
    def axis(self) -> str: ...

    def fmt(self, load: float) -> str: ...


class CapacityResult(Protocol):
    @property
    def plan(self) -> _Plan: ...
    @property
    def points(self) -> Sequence[SearchPoint]: ...
    @property
    def max_load(self) -> float | None: ...
    @property
    def missed_at(self) -> float | None: ...


def mean_of(values: list[Any]) -> float | None:
    """The mean of the numbers among `values` (None, absent figures, left out); None when there are none."""
    vals = [float(v) for v in values if isinstance(v, int | float)]
    return sum(vals) / len(vals) if vals else None


def point_offered(pt: SearchPoint) -> float | None:
    """The point's offered rate: the mean over its counted runs (None: closed loop, or no summary said)."""
    return mean_of([r.figures.get("offered_rps") for r in pt.counted])


def load_unit(axis: str, runs: Sequence[_Run]) -> str:
    """What a search's load counts: streams, or what --rate counted as the runs' summaries say (`offered.unit`:
    sessions/s where agent sessions arrive at --rate, each then running its turns closed-loop), else requests/s."""
    if axis != "rate":
        return {"streams": "streams", "time-scale": "× the trace's speed"}[axis]
    return "sessions/s" if any(r.rate_unit == "sessions/s" for r in runs) else "requests/s"


def offered_tag(pt: SearchPoint) -> str:
    """', offered 2.6' for a point's status line (empty where nothing was offered on a schedule)."""
    offered = point_offered(pt)
    return "" if offered is None else f", offered {fmt_rate(offered)}"


def offered_at(result: CapacityResult, load: float | None) -> dict[str, float | None] | None:
    """What the runs at `load` offered, over every point run there: mean offered rate, arrivals, expected."""
    runs = [r for p in result.points if p.load == load for r in p.counted]
    offered = mean_of([r.figures.get("offered_rps") for r in runs])
    if load is None or result.plan.axis != "rate" or offered is None:
        return None
    return {"nominal_rps": load, "offered_rps": offered, "shortfall": 1 - offered / load,
            "arrivals": mean_of([r.figures.get("arrivals") for r in runs]),
            "expected_arrivals": mean_of([r.figures.get("expected_arrivals") for r in runs]),
            "window_s": mean_of([r.figures.get("window_s") for r in runs]),
            "count_noise": mean_of([r.figures.get("count_noise") for r in runs])}


def steadier_duration_s(at: dict[str, float | None]) -> int:
    """The --duration whose arrival count varies by about TARGET_NOISE (the runs' burstiness is in their noise)."""
    noise, window = at.get("count_noise"), at.get("window_s")
    if noise and window:
        return round_up_s(window * (noise / TARGET_NOISE) ** 2)
    return steady_duration_s(float(at["nominal_rps"] or 1.0))


def offered_doc(result: CapacityResult) -> dict[str, Any]:
    """capacity.json's offered keys: at the answer and at the lowest miss, and the note when short."""
    at = offered_at(result, result.max_load)
    return {"max_rate_offered": None if at is None else at["offered_rps"], "offered_at_max": at,
            "offered_at_missed": offered_at(result, result.missed_at), "offered_note": offered_caveat(result).strip() or None}


def offered_caveat(result: CapacityResult) -> str:
    """The verdict's sentence where the answer's runs offered more than SHORTFALL_NOTE below its nominal rate."""
    at = offered_at(result, result.max_load)
    if at is None or result.max_load is None or (at["shortfall"] or 0.0) <= SHORTFALL_NOTE:
        return ""
    p, offered = result.plan, float(at["offered_rps"] or 0.0)
    counts = ""
    if at["arrivals"] is not None and at["expected_arrivals"] is not None and at["window_s"]:
        counts = (f": its {at['window_s']:g} s windows held {at['arrivals']:.0f} arrivals where the rate implies "
                  f"{at['expected_arrivals']:.0f}")
    unit = load_unit(p.axis, [r for pt in result.points for r in pt.counted])
    miss = offered_at(result, result.missed_at)
    missed = "" if miss is None else (f"; the lowest miss, {p.fmt(result.missed_at or 0.0)} {unit}, offered "
                                      f"{fmt_rate(float(miss['offered_rps'] or 0.0))}")
    return (f" Offered only {fmt_rate(offered)} {unit} at {p.fmt(result.max_load)} ({at['shortfall']:.0%} below "
            f"the nominal{counts}), so what the server was shown to sustain is {fmt_rate(offered)} {unit} "
            f"offered{missed}. The window is too short for its Poisson count to settle: a longer --duration "
            f"offers nearer the nominal rate (--duration {steadier_duration_s(at)}s: ±{TARGET_NOISE:.0%}).")
