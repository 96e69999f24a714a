"""The measurement window and the table selection every metric is computed on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from itlbench.rundir.schema import TABLES, empty


@dataclass(frozen=True)
class RunWindow:
    """Run clock marks (perf_counter ns): start, end of warmup (measurement start), end."""

    run_start_ns: int
    measure_start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        """Length of the measured part of the run; rates divide by this."""
        return max(0, self.end_ns - self.measure_start_ns) / 1e9


def complete(tables: Mapping[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Every known table present (missing ones as empty frames of their schema)."""
    return {name: tables[name] if name in tables else empty(name) for name in TABLES}


def select_window(tables: Mapping[str, pl.DataFrame], window: RunWindow) -> dict[str, pl.DataFrame]:
    """Requests scheduled in [measure start, end) and their chunks (TTFT, TPOT, counts); every
    request and chunk as `all_requests`/`all_chunks` (gaps are windowed by their arrival time, so a
    long stream that began during warmup still counts its in-window gaps); steps overlapping the
    window (and every step as `all_steps`, for gaps of window requests that end after it); client and GPU samples
    inside it; server metric samples and scrapes whole (counters need a baseline)."""
    t = complete(tables)
    lo, hi = window.measure_start_ns, window.end_ns
    requests = t["requests"].filter((pl.col("scheduled_ns") >= lo) & (pl.col("scheduled_ns") < hi))
    chunks = t["chunks"].join(requests.select("request_id"), on="request_id", how="semi")
    steps = t["steps"].filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
    samples = t["client_samples"].filter((pl.col("t_ns") >= lo) & (pl.col("t_ns") < hi))
    pauses = t["client_pauses"].filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
    gpu = t["gpu_samples"].filter((pl.col("t_ns") >= lo) & (pl.col("t_ns") < hi))
    return {
        "requests": requests,
        "chunks": chunks,
        "steps": steps,
        "server_metrics": t["server_metrics"],
        "scrapes": t["scrapes"],
        "client_samples": samples,
        "client_pauses": pauses,
        "gpu_samples": gpu,
        "all_requests": t["requests"],
        "all_chunks": t["chunks"],
        "all_steps": t["steps"],
    }
