"""A run's figures against SLO targets, as `compare`'s verdict and the `capacity` search judge them.

ITL targets on the steady streams' pooled gaps (every default target: p99 and max), a class's own ITL target on
its requests' own figures, TTFT targets on each class's p99 per prompt bucket (the slowest request where too few
for a p99). The worst gap counts a stream still frozen when the window closed, as the stall analysis does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.analysis.goodput import SloSet
from itlbench.analysis.stats import supported_quantile
from itlbench.report.data import RunData


def worst_gap_s(summary: dict[str, Any]) -> float | None:
    """The longest a steady stream waited: its longest gap, or a stream still frozen when the window closed, which
    the stall analysis counts to the window's end (`stalls.worst_s`) and `itl_s.max` cannot (no token closed it).
    A run whose every stream froze under an unchunked 32k prefill read 98 ms here, not 4.97 s, and ranked smoothest."""
    present = [v for v in ((summary.get("itl_s") or {}).get("max"), (summary.get("stalls") or {}).get("worst_s"))
               if v is not None]
    return max(present) if present else None


@dataclass(frozen=True)
class Check:
    what: str
    target_s: float
    value_s: float | None
    figure: str = "ttft_s"  # the summary figure the check rests on (capacity doubts a miss through it)

    @property
    def ok(self) -> bool:
        return self.value_s is not None and self.value_s <= self.target_s


def _stat(values: pl.Series) -> tuple[str, float | None]:
    """p99 where the samples support it, else the worst value (the conservative reading of p99)."""
    p99 = supported_quantile(values, 0.99)
    return ("p99", p99) if p99 is not None else ("max", values.max() if values.len() else None)  # type: ignore[return-value]


def slo_checks(run: RunData, slos: SloSet) -> list[Check]:
    """Each SLO target against the run's aggregate: every default ITL target (p99, max) on pooled steady gaps, a
    class's own ITL targets on its requests' own figures, TTFT per class and bucket (p99 where the requests
    support one, else the worst request)."""
    checks = _itl_checks(run.summary, slos)
    checks += _class_itl_checks(run.judged, slos)
    t = run.ttft.filter(pl.col("ttft_s").is_not_null())
    for cls in sorted(t["cls"].drop_nulls().unique().to_list()):
        targets = slos.for_class(cls).ttft_s
        for bucket in BUCKET_LABELS:
            group = t.filter((pl.col("cls") == cls) & (pl.col("bucket") == bucket))
            if group.is_empty() or targets.get(bucket) is None:
                continue
            stat, value = _stat(group["ttft_s"])
            name = "injected TTFT" if cls == "injected" else f"{cls} TTFT {stat}"
            checks.append(Check(f"{name} ({bucket}, {_requests(group.height)})", float(targets[bucket]), value))  # type: ignore[arg-type]
    return checks


def _itl_checks(summary: dict[str, Any], slos: SloSet) -> list[Check]:
    """The default ITL targets on the pooled steady gaps: `itl_p99=40ms,itl_max=100ms` judges both (only the
    first was, so a worst gap over its max passed); max is the worst gap, a stream frozen at the window's end in."""
    itl = summary.get("itl_s") or {}
    checks = []
    for stat, target in slos.default.itl_targets.items():
        if target is None:
            continue
        value, name = (worst_gap_s(summary) if stat == "max" else itl.get(stat)), f"ITL {stat}"
        if value is None and stat == "p99":
            name, value = "ITL max (too few gaps for a p99)", worst_gap_s(summary)
        checks.append(Check(name, target, value, "itl_s"))
    return checks


def _class_itl_checks(judged: pl.DataFrame, slos: SloSet) -> list[Check]:
    """A class's own ITL targets (`chat/itl_p99=30ms`), which goodput judged but compare ignored. Its pooled gaps
    are not kept, so each is read on the class's requests' own figures: the worst gap of any (max, exact), or
    the p99 over its requests of their own p99 (the slowest request's where too few for a p99)."""
    checks = []
    for cls, slo in sorted(slos.classes.items()):
        if slo.itl_targets == slos.default.itl_targets or "cls" not in judged.columns:
            continue
        rows = judged.filter(pl.col("cls") == cls)
        for stat, target in slo.itl_targets.items():
            values = rows[f"itl_{stat}_s"].drop_nulls() if f"itl_{stat}_s" in rows.columns else pl.Series([])
            if target is None or values.is_empty():
                continue
            if stat == "max":
                checks.append(Check(f"{cls} ITL max ({_requests(values.len())})", target, float(values.max()),  # type: ignore[arg-type]
                                    "itl_s"))
                continue
            over, value = _stat(values)
            what = "p99 of its requests' own p99s" if over == "p99" else "worst request's own p99"
            checks.append(Check(f"{cls} ITL {what} ({_requests(values.len())})", target, value, "itl_s"))
    return checks


def _requests(n: int) -> str:
    return f"{n:,} request" + ("" if n == 1 else "s")
