"""Percentiles and JSON-safe numbers shared by the analysis modules.

Percentile method: linear interpolation between closest ranks (numpy's default "linear", polars'
`interpolation="linear"`): for n sorted values x[0..n-1], the q-quantile sits at position q·(n−1).
An empty input gives null for every statistic and count 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear'): position q*(n-1)"

QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}


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
    row = df.select(stat_expr(col, k) for k in keys).row(0, named=True)
    return json_safe(row)


def describe_by(
    df: pl.DataFrame, col: str, by: str, keys: Sequence[str], labels: Sequence[str] | None = None
) -> dict[str, dict[str, float | int | None]]:
    """`describe` per group; `labels` fixes the group set (missing groups get empty stats)."""
    out: dict[str, dict[str, float | int | None]] = {}
    if df.height:
        grouped = df.filter(pl.col(by).is_not_null()).group_by(by).agg(stat_expr(col, k) for k in keys)
        for row in grouped.sort(by).iter_rows(named=True):
            out[str(row.pop(by))] = json_safe(row)
    if labels is None:
        return out
    empty = {k: (0 if k == "count" else None) for k in keys}
    return {label: out.get(label, dict(empty)) for label in labels}


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
