"""Why requests failed, grouped by `error_kind` (set by the streaming client), with one example
message per kind: a server answering HTML, a body that is no event stream, `data:` lines that are
not JSON, streams cut short, HTTP errors, headers that never came, connections closed mid-stream."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import json_safe


def failure_summary(requests: pl.DataFrame) -> dict[str, object]:
    """failures.{count, total, by_kind.<kind>.{count, example}, line}; requests cancelled mid-stream
    at the end of the drain are not failures (those cancelled before any response header are)."""
    drained = (pl.col("status") == "cancelled") & pl.col("error_kind").fill_null("cancelled").eq("cancelled")
    failed = requests.filter((pl.col("status") != "ok") & ~drained)  # cut at the drain timeout: not a failure
    by_kind: dict[str, dict[str, object]] = {}
    if failed.height:
        grouped = (failed.with_columns(pl.col("error_kind").fill_null(pl.col("status")).alias("kind"))
                   .group_by("kind").agg(pl.len().alias("count"), pl.col("error").drop_nulls().first().alias("example"))
                   .sort(["count", "kind"], descending=[True, False]))
        by_kind = {r["kind"]: {"count": int(r["count"]), "example": r["example"]} for r in grouped.to_dicts()}
    line = None
    if failed.height:
        parts = ", ".join(f"{k} {v['count']}" for k, v in by_kind.items())
        first = next(iter(by_kind.values()))
        line = f"{failed.height} of {requests.height} requests failed: {parts}; e.g. {first['example']}"
    return json_safe({"count": failed.height, "total": requests.height, "by_kind": by_kind,
                      "line": line})  # type: ignore[return-value]
