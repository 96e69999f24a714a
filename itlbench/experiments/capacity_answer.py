"""The capacity search's answer in one sentence: the load, its margin, and every caveat (not confirmed, offered
below the nominal rate, stopped early, not monotone, ITL not measured above it), or what an interrupted search
had established."""

from __future__ import annotations

from itlbench.experiments.capacity import CapacityResult
from itlbench.experiments.capacity_offered import offered_caveat

# what a point whose tokens arrived together needs to be judged (capacity_judge.unmeasured)
UNMEASURED_FIX = ("To judge ITL there, measure where each token reaches the client as it is made: no buffering "
                  "proxy in the path, a server that streams, and CPU enough for its API server to keep up (fewer "
                  "engine threads or a larger machine).")


def not_judged_clause(result: CapacityResult, load: float, unit: str, lowest: float | None = None) -> str:
    """'ITL could not be measured at 4 requests/s: tokens arrived together (98% of 1,204 gaps are 0)'; with
    `lowest`, at every load from `load` down to it."""
    p = result.plan
    why = next((u for pt in result.points if pt.load == (lowest or load) and pt.not_judged for u in pt.unmeasured),
               "the run's validity checks withdrew it")
    where = (f"at {p.fmt(load)} {unit}" if lowest is None or lowest == load
             else f"at any load tried, {p.fmt(load)} down to {p.fmt(lowest)} {unit}")
    return f"ITL could not be measured {where}: {why.split(': ')[0]}"


def _so_far(result: CapacityResult, unit: str, what: str) -> str:
    """What an interrupted search had established: a bracket, a floor, or only misses."""
    p, met, missed = result.plan, result.max_load, result.missed_at
    if met is not None and result.not_judged_at is not None:
        return (f"so far {what} held up to {p.fmt(met)} {unit}, and "
                f"{not_judged_clause(result, result.not_judged_at, unit)} (capacity ≥ {p.fmt(met)}, not confirmed)")
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
        return _none_found(result, unit, what)
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
    if result.not_judged_at is not None:
        return _not_judged_above(result, unit, what, caveat)
    if result.missed_at is None:
        at_max = p.load_max is not None and result.max_load >= p.load_max
        limit = "--rate-max" if at_max else f"--max-points (it ran all {p.max_points})"
        return (f"Capacity ≥ {p.fmt(result.max_load)} {unit}: {what} held at every load tried "
                f"(raise {limit} to look further).{caveat}")
    holds = "hold" if p.budget.spec else "holds"
    return (f"Capacity: {p.fmt(result.max_load)} {unit} ({what} {holds}; {p.fmt(result.missed_at)} {unit} misses, "
            f"so the boundary lies within +{p.fmt(result.missed_at - result.max_load)} {unit}).{caveat}"
            f"{_what_held(result, unit)}")


def _none_found(result: CapacityResult, unit: str, what: str) -> str:
    """No load met: the lowest that missed, where ITL could not be measured, or why the search stopped."""
    p = result.plan
    missed = [pt.load for pt in result.points if pt.missed and not pt.empty]
    unjudged = [pt.load for pt in result.points if pt.not_judged]
    found = [f"even {p.fmt(min(missed))} {unit} misses {what}"] if missed else []
    if unjudged:
        found.append(not_judged_clause(result, max(unjudged), unit, min(unjudged)))
    said = ", and ".join(found) or "no point measured anything"
    if result.stopped:
        return f"No capacity found: {said}, and {result.stopped}." + (f" {UNMEASURED_FIX}" if unjudged else "")
    if unjudged:
        return f"No capacity found: {said}. {UNMEASURED_FIX}"
    return f"No load tried meets {what}: even {p.fmt(min(missed))} {unit} misses." if missed else "No point was measured."


def _not_judged_above(result: CapacityResult, unit: str, what: str, caveat: str) -> str:
    """The answer where the load above it went unjudged: a floor, not a boundary, and what would judge it."""
    p = result.plan
    met = p.fmt(result.max_load or 0.0)
    below = "" if result.missed_at is None else f" (it is below {p.fmt(result.missed_at)} {unit}, which misses)"
    holds = "hold" if p.budget.spec else "holds"
    return (f"Capacity ≥ {met} {unit}: {what} {holds} there, but "
            f"{not_judged_clause(result, result.not_judged_at or 0.0, unit)}, so above {met} {unit} the capacity "
            f"is not known{below}. {UNMEASURED_FIX}{caveat}{_what_held(result, unit)}")


def _what_held(result: CapacityResult, unit: str) -> str:
    """Where the engine's queue held requests at the first load that missed: which limit (batch cap, token
    budget, K/V) a user would move to raise the capacity."""
    runs = [r for pt in result.points if pt.load == result.missed_at for r in pt.counted]
    line = next((r.queueing for r in runs if r.queueing), None)
    if line is None or result.missed_at is None:
        return ""
    return f" At {result.plan.fmt(result.missed_at)} {unit}: {line}"  # the sentence whole, whatever it opens with
