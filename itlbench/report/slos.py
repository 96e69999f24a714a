"""The SLOs a run's goodput was judged against, in words, wherever goodput is reported.

A run given no `--slo` is judged against the defaults (analysis/goodput.py: TTFT per prompt bucket,
each request's ITL p99 ≤ 200 ms); run.json then says `slo: null`, so a report that printed goodput
without them would count requests against targets it never showed. `summary.goodput.slos` holds what
was applied: `spec` (the --slo text, "" for none), `default` and per-class overrides in `classes`.
"""

from __future__ import annotations

from typing import Any

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.analysis.goodput import ClassSlo, SloSet
from itlbench.report.durations import fmt_s

DOCS = "docs/measures.md, Goodput"


def slos_of(summary: dict[str, Any]) -> dict[str, Any]:
    return ((summary.get("goodput") or {}).get("slos")) or {}


def is_default(slos: dict[str, Any]) -> bool:
    """No --slo was given: every target is a default."""
    return not slos.get("spec") and not slos.get("classes")


def _targets(c: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """One class's targets ('TTFT ≤ 500 ms le128, …; ITL p99 ≤ 200 ms'), only those unlike `base`'s."""
    ttft = c.get("ttft_s") or {}
    old_ttft = (base or {}).get("ttft_s") or {}
    buckets = [b for b in BUCKET_LABELS if b in ttft and (base is None or ttft.get(b) != old_ttft.get(b))]
    parts = []
    if buckets:
        if len({ttft.get(b) for b in buckets}) == 1 and len(buckets) == len(BUCKET_LABELS):
            v = ttft[buckets[0]]
            parts.append("TTFT " + ("off" if v is None else f"≤ {fmt_s(v)}") + " in every bucket")
        else:
            parts.append("TTFT " + ", ".join(f"{b} {'off' if ttft[b] is None else '≤ ' + fmt_s(ttft[b])}"
                                             for b in buckets))
    itl = c.get("itl_targets") or ({c["itl_stat"]: c.get("itl_s")} if c.get("itl_stat") else {})
    if base is None or itl != ((base.get("itl_targets")) or {}):
        set_ = {k: v for k, v in itl.items() if v is not None}
        parts.append("; ".join(f"ITL {k} ≤ {fmt_s(v)} (each request's own gaps)" for k, v in set_.items())
                     if set_ else "no ITL target")
    return "; ".join(parts)


def judges_nothing(slos: SloSet) -> bool:
    """`--slo` turned every target off (TTFT in every bucket and every ITL statistic, for every class)."""
    return all(all(v is None for v in c.ttft_s.values()) and all(v is None for v in c.itl_targets.values())
               for c in (slos.default, *slos.classes.values()))


def slo_set_words(slos: SloSet) -> str:
    """What a verdict was judged against, in a few words: a `--slo` that sets one target leaves the default
    others in force (`itl_max=100ms` still judges TTFT by bucket), so the words say so."""
    if not slos.spec:
        return "the default SLOs"
    if judges_nothing(slos):
        return f"--slo {slos.spec}: every target off"
    return f"--slo {slos.spec} over the default targets"


def slo_text(summary: dict[str, Any]) -> str | None:
    """'the default SLOs (no --slo given): TTFT ≤ …; ITL p99 ≤ 200 ms …', or the --slo over them; None
    for a summary without goodput."""
    slos = slos_of(summary)
    default = slos.get("default")
    if not isinstance(default, dict):
        return None
    if is_default(slos):
        return f"the default SLOs (no --slo given; {DOCS}): {_targets(default)}"
    text = f"--slo {slos.get('spec')} over the defaults: {_targets(default)}"
    for cls, c in sorted((slos.get("classes") or {}).items()):
        if (diff := _targets(c, default)):
            text += f"; for {cls}: {diff}"
    return text


def itl_target(summary: dict[str, Any]) -> tuple[str, float, bool] | None:
    """The default class's ITL target to draw: (name, seconds, whether a default)."""
    slos = slos_of(summary)
    default = slos.get("default") or {}
    if not default.get("itl_s"):
        return None
    given = default.get("itl_targets") or {default.get("itl_stat", "p99"): default["itl_s"]}
    return f"itl_{default.get('itl_stat', 'p99')}", float(default["itl_s"]), given == ClassSlo().itl_targets
