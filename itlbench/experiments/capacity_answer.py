"""The capacity search's answer in one sentence: the load, its margin, and every caveat (not confirmed, offered
below the nominal rate, stopped early, not monotone), or what an interrupted search had established."""

from __future__ import annotations

from itlbench.experiments.capacity import CapacityResult
from itlbench.experiments.capacity_offered import offered_caveat


def _so_far(result: CapacityResult, unit: str, what: str) -> str:
    """What an interrupted search had established: a bracket, a floor, or only misses."""
    p, met, missed = result.plan, result.max_load, result.missed_at
    if met is not None and missed is not None:
        return (f"so far {p.fmt(met)} {unit} met {what} and {p.fmt(missed)} {unit} missed, so the capacity lies "
                "between them (not confirmed)")
    if met is not None:
        return f"so far {what} held up to {p.fmt(met)} {unit} (capacity ≥ {p.fmt(met)}, not confirmed)"
    if missed is not None:
        return f"so far no load tried met {what} (the lowest tried, {p.fmt(missed)} {unit}, missed)"
    return "no point had finished, so nothing was established"


def answer_line(result: CapacityResult) -> str:
    """The answer in one sentence, with its margin (where the boundary lies between); an interrupted or
    stopped search says so first, with what it had established."""
    p = result.plan
    unit = result.unit  # requests/s, sessions/s (agent sessions at --rate), or streams
    what = "every SLO" + (" and the stall budget" if p.budget.spec else "")
    if result.interrupted:
        where = "" if result.interrupted_at is None else f" at {p.fmt(result.interrupted_at)} {unit}"
        return f"Search interrupted (Ctrl-C or SIGTERM){where}: {_so_far(result, unit, what)}."
    if result.max_load is None:
        measured = [pt.load for pt in result.points if pt.counted and not pt.empty]
        found = (f"even {p.fmt(min(measured))} {unit} misses {what}" if measured else "no point measured anything")
        if result.stopped:
            return f"No capacity found: {found}, and {result.stopped}."
        return (f"No load tried meets {what}: even {p.fmt(min(measured))} {unit} misses." if measured
                else "No point was measured.")
    why = "" if result.stopped else f" (--max-points {p.max_points})"
    caveat = "" if result.confirmed else (f" Not confirmed: the search stopped{why} before "
                                          f"{p.fmt(result.max_load)} ran {p.repeat} times.")
    caveat += offered_caveat(result)  # its runs offered well below the nominal rate: what they showed, the fix
    if result.stopped:
        caveat += f" The search ended early: {result.stopped}."
    if result.inversions:
        hi_met, lo_missed = max(result.inversions, key=lambda t: t[0] - t[1])
        caveat += (f" Not monotone: {p.fmt(hi_met)} {unit} met but {p.fmt(lo_missed)} missed, so the run-to-run "
                   "noise is larger than the boundary's slope (longer --duration or more --repeat).")
    if result.missed_at is None:
        at_max = p.load_max is not None and result.max_load >= p.load_max
        limit = "--rate-max" if at_max else f"--max-points (it ran all {p.max_points})"
        return (f"Capacity ≥ {p.fmt(result.max_load)} {unit}: {what} held at every load tried "
                f"(raise {limit} to look further).{caveat}")
    holds = "hold" if p.budget.spec else "holds"
    return (f"Capacity: {p.fmt(result.max_load)} {unit} ({what} {holds}; {p.fmt(result.missed_at)} {unit} misses, "
            f"so the boundary lies within +{p.fmt(result.missed_at - result.max_load)} {unit}).{caveat}"
            f"{_what_held(result, unit)}")


def _what_held(result: CapacityResult, unit: str) -> str:
    """Where the engine's queue held requests at the first load that missed: which limit (batch cap, token
    budget, K/V) a user would move to raise the capacity."""
    runs = [r for pt in result.points if pt.load == result.missed_at for r in pt.counted]
    line = next((r.queueing for r in runs if r.queueing), None)
    if line is None or result.missed_at is None:
        return ""
    return f" At {result.plan.fmt(result.missed_at)} {unit}: {line}"  # the sentence whole, whatever it opens with
