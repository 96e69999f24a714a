"""Goodput: requests per second that met every SLO of their class.

A request is good when its status is "ok" and
  TTFT ≤ the TTFT target of its class and prompt bucket (no target: met), and
  each of its own ITL statistics that has a target (p99 — linear interpolation — and/or max of all its
  gaps, those that arrived after the window closed too) ≤ that target (no target, or a stream with no gaps: met).
goodput = good requests / window seconds; fraction = good / requests in the window.

SLO grammar (`--slo`), comma-separated items layered over the defaults:
  [CLASS/]ttft:BUCKET=DUR | [CLASS/]ttft=DUR (all buckets) | [CLASS/]itl_p99=DUR | [CLASS/]itl_max=DUR
DUR is a number with unit us, ms, s or m (bare number = seconds) or "off" (no target). Items without
CLASS/ set the default every class inherits; CLASS/ items override for that class only. CLASS is a
workload name or `injected`. ITL targets given together all apply (`itl_p99=50ms,itl_max=500ms`); the
first one given in a scope replaces the targets it inherits. A target given twice is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.errors import ConfigError
from itlbench.units import parse_duration_s

DEFAULT_TTFT_S: dict[str, float | None] = {
    "le128": 0.5,
    "le512": 1.0,
    "le2k": 2.0,
    "le8k": 5.0,
    "le32k": 15.0,
    "gt32k": 60.0,
}
ITL_STATS = ("p99", "max")
SLO_FIX = "e.g. 'ttft:le2k=2s,itl_p99=150ms,injected/ttft=off'; buckets: " + ", ".join(BUCKET_LABELS)


@dataclass(frozen=True)
class ClassSlo:
    """Targets for one class: TTFT per bucket (None = none) and ITL targets per statistic (p99, max), every
    one of which a request must meet; `itl_stat`/`itl_s` name the first, for readers of one ITL target."""

    ttft_s: dict[str, float | None] = field(default_factory=lambda: dict(DEFAULT_TTFT_S))
    itl_targets: dict[str, float | None] = field(default_factory=lambda: {"p99": 0.2})

    @property
    def itl_stat(self) -> str:
        return next(iter(self.itl_targets), "p99")

    @property
    def itl_s(self) -> float | None:
        return self.itl_targets.get(self.itl_stat)

    def to_dict(self) -> dict[str, object]:
        return {"ttft_s": dict(self.ttft_s), "itl_stat": self.itl_stat, "itl_s": self.itl_s,
                "itl_targets": dict(self.itl_targets)}


@dataclass(frozen=True)
class SloSet:
    """The default targets and per-class overrides (already merged over the default)."""

    default: ClassSlo = field(default_factory=ClassSlo)
    classes: dict[str, ClassSlo] = field(default_factory=dict)
    spec: str = ""

    def for_class(self, cls: str | None) -> ClassSlo:
        return self.classes.get(cls or "", self.default)

    def to_dict(self) -> dict[str, object]:
        return {
            "spec": self.spec,
            "default": self.default.to_dict(),
            "classes": {k: v.to_dict() for k, v in sorted(self.classes.items())},
        }


def _duration(item: str, text: str) -> float | None:
    if text == "off":
        return None
    try:
        value = parse_duration_s(text, "--slo")
    except ConfigError:
        value = 0.0
    if value <= 0:
        raise ConfigError("--slo", f"{item!r}: {text!r} is not a positive duration", SLO_FIX)
    return value


def _apply(slo: ClassSlo, item: str, key: str, value: float | None, first_itl: bool) -> ClassSlo:
    """`slo` with one item applied; the first ITL item of a scope replaces the inherited ITL targets, later
    ones add to them, so `itl_p99=50ms,itl_max=500ms` holds a request to both."""
    if key == "ttft":
        return replace(slo, ttft_s=dict.fromkeys(BUCKET_LABELS, value))
    if key.startswith("ttft:"):
        bucket = key[5:]
        if bucket not in BUCKET_LABELS:
            raise ConfigError("--slo", f"{item!r}: unknown prompt bucket {bucket!r}", SLO_FIX)
        return replace(slo, ttft_s={**slo.ttft_s, bucket: value})
    if key.startswith("itl_") and key[4:] in ITL_STATS:
        kept = {} if first_itl else slo.itl_targets
        return replace(slo, itl_targets={**kept, key[4:]: value})
    raise ConfigError("--slo", f"{item!r}: unknown target {key!r}", SLO_FIX)


def _items(spec: str) -> list[tuple[str, str, str, float | None]]:
    """(item, class or '', key, seconds) per comma-separated item; a target given twice is refused."""
    out = []
    seen: set[tuple[str, str]] = set()
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise ConfigError("--slo", f"{item!r} has no '='", SLO_FIX)
        left, value = (s.strip() for s in item.split("=", 1))
        cls, _, key = left.rpartition("/")
        if not key:
            raise ConfigError("--slo", f"{item!r} names no target", SLO_FIX)
        _check_class(item, cls)
        if (cls, key) in seen:
            raise ConfigError("--slo", f"{item!r}: {left!r} is given twice", "give each target once")
        seen.add((cls, key))
        out.append((item, cls, key, _duration(item, value)))
    return out


def _check_class(item: str, cls: str) -> None:
    """A misspelt class would silently set a target no request has: only the classes a run can hold."""
    from itlbench.workloads.catalog import CATALOG, FIXED_PREFIX

    known = [*CATALOG, "injected"]
    if cls and cls not in known and not cls.startswith(FIXED_PREFIX):
        raise ConfigError("--slo", f"{item!r}: unknown class {cls!r}",
                          f"classes: {', '.join(known)} or fixed:IN:OUT (the workload's name)")


def _layer(slo: ClassSlo, items: list[tuple[str, str, str, float | None]]) -> ClassSlo:
    """`slo` with `items` (all of one scope) applied in order."""
    first_itl = True
    for item, _cls, key, value in items:
        slo = _apply(slo, item, key, value, first_itl and key.startswith("itl_"))
        first_itl = first_itl and not key.startswith("itl_")
    return slo


def parse_slo(spec: str | None, base: SloSet | None = None) -> SloSet:
    """Parse an --slo string over `base` (default SLOs when None); raises ConfigError("--slo", ...)."""
    base = base or SloSet()
    items = _items(spec or "")
    if spec and spec.strip() and not items:  # ',' fell back to the defaults, silently ('' is the defaults)
        raise ConfigError("--slo", f"{spec!r} lists no target", f"{SLO_FIX}; or leave --slo out for the defaults")
    default = _layer(base.default, [i for i in items if not i[1]])
    names = dict.fromkeys(i[1] for i in items if i[1])
    classes = {cls: _layer(default, [i for i in items if i[1] == cls]) for cls in names}
    merged = {**base.classes, **classes}
    return SloSet(default, merged, ",".join(filter(None, [base.spec, (spec or "").strip()])))


def request_itl(gaps: pl.DataFrame) -> pl.DataFrame:
    """Per request: its own gaps' p99 (linear) and max."""
    return gaps.group_by("request_id").agg(
        pl.col("gap_s").quantile(0.99, interpolation="linear").alias("itl_p99_s"),
        pl.col("gap_s").max().alias("itl_max_s"),
    )


def _targets(slos: SloSet, classes: list[str | None]) -> tuple[pl.DataFrame, pl.DataFrame]:
    ttft_rows, itl_rows = [], []
    for cls in classes:
        slo = slos.for_class(cls)
        ttft_rows += [{"cls": cls, "bucket": b, "ttft_target_s": slo.ttft_s.get(b)} for b in BUCKET_LABELS]
        itl_rows.append({"cls": cls, **{f"itl_{stat}_target_s": slo.itl_targets.get(stat) for stat in ITL_STATS}})
    ttft = pl.DataFrame(ttft_rows, schema={"cls": pl.Utf8, "bucket": pl.Utf8, "ttft_target_s": pl.Float64})
    itl = pl.DataFrame(itl_rows, schema={"cls": pl.Utf8, **{f"itl_{stat}_target_s": pl.Float64 for stat in ITL_STATS}})
    return ttft, itl


def _itl_met(stat: str) -> pl.Expr:
    """One ITL statistic met: no target, no gaps, or the request's own value within it."""
    target, value = pl.col(f"itl_{stat}_target_s"), pl.col(f"itl_{stat}_s")
    return target.is_null() | value.is_null() | (value <= target)


def judge(ttft: pl.DataFrame, gaps: pl.DataFrame | None, slos: SloSet,
          itl_rows: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per request (rows of ttft.ttft_table): ttft_ok, itl_ok (every ITL target met), good. `itl_rows`
    (request_itl rows) stands in for the gaps when a large run computed them request by request."""
    ttft_targets, itl_targets = _targets(slos, ttft["cls"].unique().to_list())
    return (
        ttft.join(ttft_targets, on=["cls", "bucket"], how="left", nulls_equal=True)
        .join(itl_targets, on="cls", how="left", nulls_equal=True)
        .join(request_itl(gaps) if gaps is not None else itl_rows, on="request_id", how="left")
        .with_columns(
            (
                pl.col("ttft_target_s").is_null()
                | (pl.col("ttft_s") <= pl.col("ttft_target_s")).fill_null(False)
            ).alias("ttft_ok"),
            *[_itl_met(stat).alias(f"itl_{stat}_ok") for stat in ITL_STATS],
        )
        .with_columns(pl.all_horizontal(*[f"itl_{stat}_ok" for stat in ITL_STATS]).alias("itl_ok"))
        .with_columns(
            ((pl.col("status") == "ok").fill_null(False) & pl.col("ttft_ok") & pl.col("itl_ok")).alias("good")
        )
    )


def _ttft_misses(judged: pl.DataFrame) -> list[dict[str, object]]:
    missed = judged.filter(~pl.col("ttft_ok"))
    if missed.is_empty():
        return []
    totals = judged.group_by("cls", "bucket").agg(pl.len().alias("of"))
    rows = (missed.group_by("cls", "bucket").agg(
        pl.len().alias("missed"), pl.col("ttft_target_s").first().alias("target_s"),
        pl.col("ttft_s").median().alias("median_s"), pl.col("ttft_s").max().alias("worst_s"))
        .join(totals, on=["cls", "bucket"], nulls_equal=True).sort("missed", descending=True))
    return [{"slo": "ttft", **row} for row in rows.iter_rows(named=True)]


def _itl_misses(judged: pl.DataFrame) -> list[dict[str, object]]:
    return [miss for stat in ITL_STATS for miss in _stat_misses(judged, stat)]


def _stat_misses(judged: pl.DataFrame, stat: str) -> list[dict[str, object]]:
    """Requests that missed one ITL statistic's target, per class."""
    missed = judged.filter(~pl.col(f"itl_{stat}_ok"))
    if missed.is_empty():
        return []
    totals = judged.group_by("cls").agg(pl.len().alias("of"))
    rows = (missed.group_by("cls").agg(
        pl.len().alias("missed"), pl.col(f"itl_{stat}_target_s").first().alias("target_s"),
        pl.col(f"itl_{stat}_s").median().alias("median_s"), pl.col(f"itl_{stat}_s").max().alias("worst_s"))
        .join(totals, on="cls", nulls_equal=True).sort("missed", descending=True))
    return [{"slo": f"itl_{stat}", **row} for row in rows.iter_rows(named=True)]


def goodput(judged: pl.DataFrame, window_s: float, slos: SloSet) -> dict[str, object]:
    """Good requests per second, and every SLO that requests missed: by how many, and by how much
    (median and worst value beside the target), so a goodput of zero explains itself."""
    total = judged.height
    good = int(judged["good"].sum()) if total else 0
    failed = judged.filter(pl.col("status") != "ok").height if total else 0
    return {
        "requests_per_s": good / window_s if window_s > 0 else None,
        "fraction": good / total if total else None,
        "good": good,
        "total": total,
        "not_ok": failed,
        "misses": (_ttft_misses(judged) + _itl_misses(judged)) if total else [],
        "slos": slos.to_dict(),
    }
