"""How an external engine's /metrics was read: how often, how long each scrape took, and whether
any ran inside the measured window (by default none does: one just before it, one just after)."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s
from itlbench.analysis.window import RunWindow


def scrape_summary(scrapes: pl.DataFrame, window: RunWindow) -> dict[str, object]:
    """scrapes.{count, failed, by_reason, in_window, longest_s, total_s}; `failed` counts errors, not a
    periodic read cut by the end of the run"""
    if scrapes.is_empty():
        return {"count": 0, "failed": 0, "by_reason": {}, "in_window": 0, "longest_s": None, "total_s": 0.0}
    d = scrapes.with_columns(ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("s"))
    inside = d.filter((pl.col("end_ns") > window.measure_start_ns) & (pl.col("start_ns") < window.end_ns))
    by_reason = {r["reason"]: int(r["len"]) for r in d.group_by("reason").len().to_dicts()}
    return json_safe({"count": d.height, "failed": d.filter(pl.col("status") == "error").height,
                      "by_reason": dict(sorted(by_reason.items())), "in_window": inside.height,
                      "longest_s": d["s"].max(), "total_s": d["s"].sum()})  # type: ignore[return-value]
