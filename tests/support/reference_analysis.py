"""The summary as it was computed before analysis scaled out of core (commit 08b491e): every chunk
row in memory, one polars frame of every gap. Kept as the reference the out-of-core path
(itlbench.analysis.summary.summarize_dir) must equal on runs that fit in memory; it reuses the
per-request functions, which the out-of-core path runs partition by partition, and computes every
pooled figure over the whole table at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from itlbench.analysis import itl, ttft
from itlbench.analysis.cache import cache_summary
from itlbench.analysis.crosscheck import engine_check, output_token_check, prompt_token_check
from itlbench.analysis.definitions import DEFINITIONS
from itlbench.analysis.failures import failure_summary
from itlbench.analysis.goodput import SloSet, goodput, judge, parse_slo
from itlbench.analysis.read_together import tag_gaps
from itlbench.analysis.scrapes import scrape_summary
from itlbench.analysis.server_timings import server_timings_check
from itlbench.analysis.split import time_split
from itlbench.analysis.stalls import StallParams, analyze_stalls
from itlbench.analysis.starvation import pause_breakdown
from itlbench.analysis.stats import json_safe
from itlbench.analysis.summary import _stall_params, _window_from, request_counts, throughput
from itlbench.analysis.validity import check_validity
from itlbench.analysis.window import RunWindow, select_window
from itlbench.rundir import load_tables


def reference_summary(tables: Mapping[str, pl.DataFrame], window: RunWindow, slos: SloSet | None = None,
                      stall_params: StallParams | None = None) -> dict[str, object]:
    """Today's exact in-memory computation, verbatim in its figures."""
    slos = slos or SloSet()
    stall_params = stall_params or StallParams()
    t = select_window(tables, window)
    requests, chunks, steps = t["requests"], t["chunks"], t["steps"]
    ttft_rows = ttft.ttft_table(requests, steps)
    all_requests = t["all_requests"]
    gaps = itl.gap_table(t["all_chunks"], all_requests).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    stalls = analyze_stalls(itl.steady(gaps), steps, all_requests, stall_params, window.measure_start_ns,
                            t["client_pauses"], t["scrapes"])
    client_stalls = int((stalls.summary.get("by_cause") or {}).get("client", {}).get("count", 0))  # type: ignore[union-attr]
    steady = itl.steady(gaps)
    itl_section = {
        "itl_s": itl.pooled(steady),
        "itl_all_s": itl.pooled(gaps),
        "itl_per_token_s": itl.per_token(steady),
        "tpot_s": itl.tpot(itl.tpot_table(chunks, requests).filter(~pl.col("injected"))),
        "bundling": itl.bundling(chunks),
    }
    validity = check_validity(ttft_rows, t["client_samples"], itl_section["itl_s"], None,  # type: ignore[arg-type]
                              t["client_pauses"], client_stalls,
                              tag_gaps(steady, t["all_chunks"], t["all_requests"], t["client_pauses"]))
    by_bucket: dict[str, object] = dict(ttft.ttft_by_bucket(ttft_rows))
    by_bucket["all"] = ttft.ttft_all(ttft_rows)
    out: dict[str, object] = {
        "window": {"run_start_ns": window.run_start_ns, "measure_start_ns": window.measure_start_ns,
                   "end_ns": window.end_ns, "seconds": window.seconds},
        "ttft_s": by_bucket,
        "ttft_by_class_s": ttft.ttft_by_class(ttft_rows),
        "ttft_breakdown_s": ttft.breakdown_by_bucket(ttft_rows),
        **itl_section,
        "stalls": stalls.summary,
        "split": time_split(steps, t["server_metrics"], window),
        "throughput": throughput(requests, t["all_chunks"].filter(
            (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns)), window.seconds),
        "goodput": goodput(judge(ttft_rows, gaps, slos), window.seconds, slos),
        "requests": request_counts(requests),
        "failures": failure_summary(requests),
        "cache": cache_summary(requests, t["server_metrics"], window),
        "scrapes": scrape_summary(t["scrapes"], window),
        "client_pauses": pause_breakdown(t["client_pauses"]),
        "valid": validity["valid"],
        "validity": {k: v for k, v in validity.items() if k != "valid"},
        "crosscheck": {"engine": engine_check(requests, chunks, steps),
                       "prompt_tokens": prompt_token_check(requests),
                       "output_tokens": output_token_check(requests),
                       "server_timings": server_timings_check(requests)},
        "definitions": dict(DEFINITIONS),
    }
    return json_safe(out)  # type: ignore[return-value]


def reference_of_dir(run_dir: str | Path) -> dict[str, object]:
    """`reference_summary` of a stored run, read whole (as `analyze_run` read it before)."""
    meta = json.loads(Path(run_dir, "run.json").read_text())
    slo = meta.get("slo")
    return reference_summary(load_tables(run_dir), _window_from(meta),
                             parse_slo(slo if isinstance(slo, str) else None), _stall_params(meta))


# Sums and means are added in a different order when merged over partitions: they may differ in their
# last bits, nothing more. Everything else (counts, max, percentiles, stalls, verdicts) must be equal.
FLOAT_REL = 1e-12


def differences(mine: object, ref: object, path: str = "") -> list[str]:
    """Every place two summaries differ (floats beyond FLOAT_REL), as 'path: mine != ref'."""
    if isinstance(mine, dict) and isinstance(ref, dict):
        out = [f"{path}.{k}: missing" for k in set(mine) ^ set(ref)]
        for k in set(mine) & set(ref):
            out += differences(mine[k], ref[k], f"{path}.{k}")
        return out
    if isinstance(mine, list) and isinstance(ref, list):
        if len(mine) != len(ref):
            return [f"{path}: {len(mine)} items != {len(ref)}"]
        return [d for i, (a, b) in enumerate(zip(mine, ref, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(mine, float) and isinstance(ref, float) and not isinstance(mine, bool):
        same = math.isclose(mine, ref, rel_tol=FLOAT_REL, abs_tol=1e-300)
        return [] if same else [f"{path}: {mine!r} != {ref!r}"]
    return [] if mine == ref and type(mine) is type(ref) else [f"{path}: {mine!r} != {ref!r}"]
