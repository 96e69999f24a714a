"""Values from an untrusted peer (a server's SSE chunks and /v1/steps rows, a Locust worker's rows),
made fit for a typed table: coerced where the meaning is clear, else dropped (null).

A strict frame refuses a whole batch for one wrongly typed cell, and a batch lost at flush time is a
run lost; so the readers coerce what they read (`as_str`, `as_count`), and `typed_series` is the
net under every table write: a column that does not build strictly is rebuilt cell by cell, a cell
that cannot be made its column's type becomes null, and the caller learns how many cells that was.
"""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_STR = 4096  # characters kept of a string a peer sent (an id, a finish reason, an error message)


def as_str(value: Any, limit: int = MAX_STR) -> str | None:
    """A string field: str kept (clipped to `limit`), a number written out, anything else null."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)[:limit]
    return None


def as_count(value: Any) -> int | None:
    """A count: a non-negative integer that fits int64 (an integral float counts), else null."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= INT64_MAX:
        return value
    return None


def as_int64(value: Any) -> int | None:
    """Any int64 (a time, an offset): integers in range, integral floats, else null."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
        return value
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _as_str_list(value: Any) -> list[str | None] | None:
    if isinstance(value, list | tuple):
        return [as_str(v) for v in value]
    return None


def coercer(dtype: pl.DataType) -> Any:
    if dtype == pl.Int64():
        return as_int64
    if dtype == pl.Float64():
        return as_float
    if dtype == pl.Utf8():
        return as_str
    if dtype == pl.Boolean():
        return _as_bool
    if dtype == pl.List(pl.Utf8()):
        return _as_str_list
    return lambda v: None


def typed_series(name: str, values: list[Any], dtype: pl.DataType) -> tuple[pl.Series, int]:
    """(series of `dtype`, cells changed): strict when every value fits, else cell by cell."""
    try:
        return pl.Series(name, values, dtype=dtype, strict=True), 0
    except Exception:  # noqa: BLE001 - polars raises several types for one bad cell; we rebuild the column
        pass
    coerce = coercer(dtype)
    fixed = [None if v is None else coerce(v) for v in values]
    changed = sum(1 for a, b in zip(values, fixed, strict=True)
                  if a is not None and (type(a) is not type(b) or a != b))
    return pl.Series(name, fixed, dtype=dtype, strict=False), changed


def loose_json(row: Any) -> str:
    """One JSON line for a row that could not be written as parquet (anything unknown as its repr)."""
    return json.dumps(row, default=repr, allow_nan=True)
