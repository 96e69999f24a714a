"""Which setting to pick: the smoothest one that meets every SLO, as the verdict ranks them, said in one line.

The comparison opens with that answer (a platform engineer's first question) and the terminal prints it first;
the verdict's full sentences follow. The ranking is the verdict's own (`smoothness`, `smoothest_meeting`): one
run per setting ranks by each run's figures, repeats by their means (`setting_rows`), so the answer and the
verdict never name two different settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from itlbench.analysis.goodput import SloSet
from itlbench.report.compare_ci import grouped, lead, rank_attr, repeated
from itlbench.report.compare_rows import Row, measured
from itlbench.report.slo_checks import Check, slo_checks
from itlbench.report.slos import judges_nothing, slo_set_words
from itlbench.report.style import fmt_s

Judged = list[tuple[Row, list[Check]]]  # (run, the checks it failed)
MEANS = ("worst_s", "p50_s", "p99_s", "p999_s", "injected_ttft_s", "ttft_p99_s", "out_tps", "stalled_s", "goodput")


def judged(rows: Sequence[Row], slos: SloSet) -> tuple[Judged, Judged]:
    """The measured runs that meet every SLO, and those that miss one with the checks they fail."""
    meets: Judged = []
    misses: Judged = []
    for r in (r for r in rows if measured(r.run)):
        failed = [c for c in slo_checks(r.run, slos) if not c.ok]
        (misses if failed else meets).append((r, failed))
    return meets, misses


def _fixed(value: float, target: float, decimals: int) -> tuple[str, str] | None:
    """Both durations in the target's unit (s from 1 s up, else ms) with `decimals` places, or None where they
    still read the same; the target drops zeros it does not need (it was typed: 20 ms, not 20.00 ms)."""
    scale, unit = (1.0, "s") if abs(target) >= 1 else (1e3, "ms")
    a, b = f"{value * scale:.{decimals}f}", f"{target * scale:.{decimals}f}"
    if a == b:
        return None
    if float(b) == round(target * scale, 9):
        b = b.rstrip("0").rstrip(".")
    return f"{a} {unit}", f"{b} {unit}"


def distinct_durations(value: float | None, target: float) -> tuple[str, str]:
    """The two durations as `fmt_s` writes them, with more places where that rounds two different values to one
    text ('20 ms > 20 ms' for 20.04 ms against 20 ms reads as a contradiction)."""
    a, b = fmt_s(value), fmt_s(target)
    if value is None or a != b or value == target:
        return a, b
    for decimals in range(1, 10):
        if (pair := _fixed(value, target, decimals)) is not None:
            return pair
    return a, b


def describe_miss(c: Check) -> str:
    value, target = distinct_durations(c.value_s, c.target_s)
    return f"{c.what} {value} > {target}"


def describe_misses(failed: list[Check], most: int = 4) -> str:
    """'ITL max 1.52 s > 500 ms; …' for the first `most`, and how many more."""
    return ("; ".join(describe_miss(c) for c in failed[:most])
            + (f" (+{len(failed) - most} more)" if len(failed) > most else ""))


def smoothness(r: Row) -> tuple[float, float]:
    """What ranks the smoothest setting: the worst gap not counting the client's own pauses (`Row.rank_s`), then
    ITL p99."""
    return r.rank_s() or 0.0, r.p99_s or 0.0


def _ranked_and_raw(r: Row) -> tuple[str, str]:
    """The figure that ranked the run and its worst gap, told apart where they are close."""
    return distinct_durations(r.rank_s(), r.worst_s or 0.0)


def gap_figures(r: Row, mark: str = "") -> str:
    """'worst gap 45 ms, ITL p99 11 ms'; where the client's own pause made the worst gap, the figure that ranked the
    run first ('worst gap 45 ms not counting the client's own pauses, 333 ms with them; ITL p99 11 ms'). `mark`:
    where the ranking figure was withdrawn, and why."""
    mark = f", {mark}" if mark else ""
    if not r.paused():
        return f"worst gap {fmt_s(r.worst_s)}{mark}{';' if mark else ','} ITL p99 {fmt_s(r.p99_s)}"
    mine, raw = _ranked_and_raw(r)
    return f"worst gap {mine} not counting the client's own pauses, {raw} with them{mark}; ITL p99 {fmt_s(r.p99_s)}"


def paused_others(best: Row, ranked: list[Row]) -> str:
    """The other ranked runs whose worst gap was the client's own pause: the table shows that gap, the ranking
    did not use it."""
    others = [(r.label, *_ranked_and_raw(r)) for r in ranked if r is not best and r.paused()]
    if not others:
        return ""
    said = "; ".join(f"{label} ({raw}; {mine} without them)" for label, mine, raw in others)
    return f" Ranked not counting the client's own pauses, which made the worst gap of {said}."


def smoothest_meeting(meets: list[Row], ranked: list[Row]) -> Row | None:
    """The smoothest of the ranked settings that meet every SLO (by identity: a Row's == compares its run's
    tables), None where none does."""
    met = {id(r) for r in meets}
    ok = [r for r in ranked if id(r) in met]
    return min(ok, key=smoothness) if ok else None


def meeting_instead(best: Row, meets: list[Row], ranked: list[Row]) -> str:
    """Where the smoothest setting misses an SLO (a batch cap of 32 kept ITL low while TTFT reached 36 s), the
    smoothest one that meets every SLO, or that none does: a reader takes "smoothest" for the recommendation."""
    if any(r is best for r in meets):
        return ""
    alt = smoothest_meeting(meets, ranked)
    if alt is None:
        return " It misses its SLOs, as does every setting."
    return f" It misses its SLOs (above); the smoothest setting that meets every one is {alt.label}, the pick."


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return sum(present) / len(present) if present else None


def setting_rows(rows: Sequence[Row]) -> list[tuple[Row, list[Row]]]:
    """Each setting as one row (its runs' mean figures, ranked on the figure `rank_attr` names, as `noise_verdict`
    ranks them) with its runs; with one run per setting, each run as it is."""
    if not repeated(rows):
        return [(r, [r]) for r in rows]
    out = []
    for label, group in grouped(rows).items():
        calm = _mean([r.worst_not_client_s for r in group]) if rank_attr(group) == "worst_not_client_s" else None
        means = {attr: _mean([getattr(r, attr) for r in group]) for attr in MEANS}
        out.append((replace(group[0], label=label, group=label, worst_not_client_s=calm, **means), group))
    return out


def _shortfall(failed: list[Check]) -> tuple[float, int]:
    """How far a run is from meeting every SLO: how far over its target its worst miss is, then how many it
    misses ((0, 0) where it meets every one)."""
    ratios = [c.value_s / c.target_s if c.value_s is not None and c.target_s > 0 else math.inf for c in failed]
    return max(ratios, default=0.0), len(failed)


def _costs(r: Row) -> str:
    """'; injected TTFT 1.63 s, 2,866 tok/s': what the setting costs beside its gaps."""
    ttft = (f"injected TTFT {fmt_s(r.injected_ttft_s)}" if r.injected_ttft_s is not None
            else f"TTFT p99 {fmt_s(r.ttft_p99_s)}" if r.ttft_p99_s is not None else "")
    said = [c for c in (ttft, f"{r.out_tps:,.0f} tok/s" if r.out_tps else "") if c]
    return "; " + ", ".join(said) if said else ""


def answer(rows: Sequence[Row], slos: SloSet) -> str | None:
    """Which setting to pick and why: the smoothest that meets every SLO (in every run, with repeats), the smoother
    ones and what they miss, and with repeats whether its lead is beyond the noise; where none meets every SLO,
    the closest and what it misses. None with fewer than two settings to rank."""
    meets, misses = judged(rows, slos)
    failed = {id(r): f for r, f in misses}
    met = {id(r) for r, _ in meets}
    settings = [(s, runs) for s, runs in setting_rows(rows) if s.rank_s() is not None]
    if len(settings) < 2:
        return None
    ranked = [s for s, _ in settings]
    pick = smoothest_meeting([s for s, runs in settings if all(id(r) in met for r in runs)], ranked)
    if pick is None:
        return _closest(settings, failed, repeated(rows), slo_set_words(slos))
    best, runs = min(ranked, key=smoothness), next(runs for s, runs in settings if s is pick)  # best: the smoothest
    every, how = (" in every run", f"means over {len(runs)} runs: ") if repeated(rows) else ("", "")
    head = "the smoothest setting, no SLO being judged" if judges_nothing(slos) else \
        f"the smoothest setting, and it meets every SLO{every}" if pick is best else \
        f"the smoothest setting that meets every SLO{every}"
    said = [f"Pick {pick.label}: {head} ({how}{gap_figures(pick)}{_costs(pick)})."]
    said += _smoother(pick, settings, failed, repeated(rows))
    said += _noise(rows, pick, [s for s, runs in settings if s is not pick and all(id(r) in met for r in runs)])
    if any(r.valid is False for r in runs):
        said.append("Treat it with care: the client may have been the bottleneck.")
    return " ".join(said)


def _smoother(pick: Row, settings: list[tuple[Row, list[Row]]], failed: dict[int, list[Check]],
              many: bool, most: int = 2) -> list[str]:
    """The settings smoother than the pick, and the SLO each misses (with repeats, in how many of its runs): why
    the pick is not the smoothest."""
    said = []
    for s, runs in sorted(((s, runs) for s, runs in settings if smoothness(s) < smoothness(pick)),
                          key=lambda t: smoothness(t[0])):
        miss = next((failed[id(r)] for r in runs if id(r) in failed), [])
        n = sum(id(r) in failed or not measured(r.run) for r in runs)
        said.append(f"{s.label} misses {describe_misses(miss, 1) if miss else 'an SLO'}"
                    + ("" if not many else " in every run" if n == len(runs) else f" in {n} of its {len(runs)} runs"))
    if not said:
        return []
    more = f"; {len(said) - most} more miss too" if len(said) > most else ""
    return [f"Smoother still, {'; '.join(said[:most])}{more}."]


def _noise(rows: Sequence[Row], pick: Row, others: list[Row]) -> list[str]:
    """With repeats, where the pick's lead over the next setting that meets every SLO is within the noise."""
    if not repeated(rows) or not others:
        return []
    nxt = min(others, key=smoothness)
    ok, why = lead(rows, pick.label, nxt.label)
    return [] if ok else [f"Its lead over {nxt.label} is within noise: {why}."]


def _closest(settings: list[tuple[Row, list[Row]]], failed: dict[int, list[Check]], many: bool, spec: str) -> str:
    """Where no setting meets every SLO: the one whose worst run is over a target by the least (then misses
    fewest), and what that run misses."""
    every = " in every run" if many else ""
    whole = [(s, runs) for s, runs in settings if all(measured(r.run) for r in runs)]
    if not whole:
        return f"No setting meets every SLO ({spec}){every}."

    def short(r: Row) -> tuple[float, int]:
        return _shortfall(failed.get(id(r), []))

    close, runs = min(whole, key=lambda t: (max(map(short, t[1])), smoothness(t[0])))
    run = max(runs, key=short)
    where, how = (f" in {run.label}", f"means over {len(runs)} runs: ") if many else ("", "")
    return (f"No setting meets every SLO ({spec}){every}; the closest is {close.label}, which misses "
            f"{describe_misses(failed.get(id(run), []), 2)}{where} ({how}{gap_figures(close)}).")
