"""Percentiles and JSON-safe numbers shared by the analysis modules.

Percentile method: linear interpolation between closest ranks (numpy's default "linear", polars'
`interpolation="linear"`): for n sorted values x[0..n-1], the q-quantile sits at position q·(n−1).
An empty input gives null for every statistic and count 0. A percentile its samples cannot support
is withheld (null beside its count): the q-quantile needs at least 1/(1−q) samples — 2 for p50, 10
for p90, 100 for p99, 1,000 for p99.9 — or it is just the largest value under another name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear'): position q*(n-1)"

QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}


def min_samples(q: float) -> int:
    """Fewest samples that support the q-quantile: 1/(1−q), so that at least one value lies beyond it."""
    return math.ceil(round(1.0 / (1.0 - q), 9))


def supported_quantile(values: pl.Series, q: float) -> float | None:
    """The q-quantile (linear) of the non-null values, or None when they are too few to support it."""
    values = values.drop_nulls()
    if values.len() < min_samples(q):
        return None
    return float(values.quantile(q, interpolation="linear"))  # type: ignore[arg-type]


def withhold_unsupported(row: dict[str, float | int | None]) -> dict[str, float | int | None]:
    """Null every percentile of a stats row whose `count` cannot support it (rows without a count pass)."""
    n = row.get("count")
    if n is None:
        return row
    return {k: (None if k in QUANTILES and int(n) < min_samples(QUANTILES[k]) else v) for k, v in row.items()}


def stat_expr(col: str, key: str) -> pl.Expr:
    """One named statistic of a column: a quantile key, max, min, mean, sum or count (non-null)."""
    c = pl.col(col)
    if key in QUANTILES:
        expr = c.quantile(QUANTILES[key], interpolation="linear")
    elif key == "count":
        expr = c.count().cast(pl.Int64)
    elif key in ("max", "min", "mean", "sum"):
        expr = getattr(c, key)()
    else:
        raise ValueError(f"unknown statistic {key!r}")
    return expr.alias(key)


def describe(df: pl.DataFrame, col: str, keys: Sequence[str]) -> dict[str, float | int | None]:
    """Statistics of one column as a plain dict (nulls ignored, NaN turned into None)."""
    if df.height == 0:
        return {k: (0 if k == "count" else None) for k in keys}
    row = df.select(stat_expr(col, k) for k in _with_count(keys)).row(0, named=True)
    return _keep(withhold_unsupported(json_safe(row)), keys)  # type: ignore[arg-type]


def describe_by(
    df: pl.DataFrame, col: str, by: str, keys: Sequence[str], labels: Sequence[str] | None = None
) -> dict[str, dict[str, float | int | None]]:
    """`describe` per group; `labels` fixes the group set (missing groups get empty stats)."""
    out: dict[str, dict[str, float | int | None]] = {}
    if df.height:
        grouped = df.filter(pl.col(by).is_not_null()).group_by(by).agg(stat_expr(col, k) for k in _with_count(keys))
        for row in grouped.sort(by).iter_rows(named=True):
            out[str(row.pop(by))] = _keep(withhold_unsupported(json_safe(row)), keys)  # type: ignore[arg-type]
    if labels is None:
        return out
    empty = {k: (0 if k == "count" else None) for k in keys}
    return {label: out.get(label, dict(empty)) for label in labels}


def _with_count(keys: Sequence[str]) -> list[str]:
    return list(keys) if "count" in keys else [*keys, "count"]


def _keep(row: dict[str, float | int | None], keys: Sequence[str]) -> dict[str, float | int | None]:
    return {k: row[k] for k in keys}


def json_safe(obj: object) -> object:
    """Recursively turn NaN/inf into None and numpy scalars into Python ones, so json.dumps(allow_nan=False) works."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        obj = obj.item()  # numpy scalar
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def ns_to_s(expr: pl.Expr) -> pl.Expr:
    """Integer nanoseconds to float seconds."""
    return expr.cast(pl.Float64) / 1e9
