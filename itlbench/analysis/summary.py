"""One run's analysis as a JSON-ready dict with stable keys (no NaN anywhere; unknown = null).

Keys (<bucket> ∈ le128, le512, le2k, le8k, le32k, gt32k; every bucket always present):
  window.{run_start_ns,measure_start_ns,end_ns,seconds}
  ttft_s.<bucket>.{p50,p90,p99,max,mean,count}        ttft_s.all.{same}
  ttft_by_class_s.<cls>.{same}
  ttft_breakdown_s.<bucket>.{client_lag_p50,queue_p50,prefill_p50,server_p50}
  itl_s.{p50,p90,p95,p99,p999,max,mean,count}          pooled gaps, steady streams (not injected)
  itl_all_s.{same}                                     pooled gaps, all streams
  itl_per_token_s.{same}                               per-token view, steady streams
  tpot_s.{p50,p90,p99,mean,count}                      per-request mean, steady streams
  stalls.{count,stalled_s,worst_s,victims,events,events_with_injected_prefill,attribution_source,params,
         overlapping_scrape}
  stalls.by_cause.<prefill|scrape|client|preemption|engine|outside_engine>.{count,stalled_s}
  stalls.attribution[]  top events: {event,start_s (from measure start),span_s,stalls,victims,worst_s,
                        prefill_steps,prefill_tokens,prefill_s,injected_prefill,prefill_request_ids,
                        injected_request_ids,longest_step_s,preemptions,client_pause_s,scrape_s,cause}
  split.{prefill_s,decode_s,prefill_frac,source}  (+ mixed_steps, cost_model | unattributed_s)
  throughput.{requests_per_s,output_tokens_per_s,input_tokens_per_s}
  goodput.{requests_per_s,fraction,good,total,not_ok,slos}
  goodput.misses[]  every SLO requests missed: {slo (ttft|itl_p99|itl_max),cls,bucket,target_s,missed,of,
                    median_s,worst_s}
  requests.{total,ok,error,timeout,cancelled,injected}
  failures.{count,total,by_kind.<kind>.{count,example},line}  failed requests by requests.error_kind
  cache.{requests_reporting,prompt_tokens,cached_tokens,cached_fraction,injected[],server,warnings}
  scrapes.{count,failed,by_reason,in_window,longest_s,total_s}  /metrics reads of an external engine
  client_pauses.{count,wall_s,measured_wall_s,cpu_s,runq_s,starved_fraction,line}  the client's loop pauses
  bundling.{fraction,chunks,bundled_chunks,tokens_per_chunk,warn_fraction,warning}
  valid, validity.{reasons,affected,standing,figures,thresholds}  (each client delay judged against the
                    figure it distorts; `affected` names keys, `standing` the headline figures that hold)
Percentiles their samples cannot support (fewer than 1/(1−q): 2 for p50, 10 for p90, 100 for p99,
1,000 for p99.9) are null beside their `count` (itlbench.analysis.stats).
  definitions.{ttft,itl,stall,split,prompt_buckets,goodput,validity,window,percentiles}
  crosscheck.engine.{source,longest_step_s,worst_client_gap_s,worst_gap_over_longest_step,injected[]}
  crosscheck.prompt_tokens.{checked,exact,max_abs_diff,reported_over_planned}
Throughput: ok requests scheduled in the window, output tokens that arrived in the window (Σ n_tokens
of every stream's chunks), prompt tokens of ok requests, each divided by the window's seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from itlbench.analysis import itl, ttft
from itlbench.analysis.buckets import prompt_tokens
from itlbench.analysis.cache import cache_summary
from itlbench.analysis.crosscheck import engine_check, prompt_token_check
from itlbench.analysis.definitions import DEFINITIONS
from itlbench.analysis.failures import failure_summary
from itlbench.analysis.goodput import SloSet, goodput, judge, parse_slo
from itlbench.analysis.read_together import tag_gaps
from itlbench.analysis.scrapes import scrape_summary
from itlbench.analysis.split import time_split
from itlbench.analysis.stalls import StallParams, analyze_stalls
from itlbench.analysis.starvation import pause_breakdown
from itlbench.analysis.stats import json_safe
from itlbench.analysis.validity import ValidityThresholds, check_validity
from itlbench.analysis.window import RunWindow, select_window
from itlbench.errors import ConfigError
from itlbench.rundir import load_tables

STATUSES = ("ok", "error", "timeout", "cancelled")


def request_counts(requests: pl.DataFrame) -> dict[str, int]:
    out = {"total": requests.height}
    for status in STATUSES:
        out[status] = requests.filter(pl.col("status") == status).height
    out["injected"] = requests.filter(pl.col("injected").fill_null(False)).height
    return out


def throughput(requests: pl.DataFrame, chunks: pl.DataFrame, window_s: float) -> dict[str, float | None]:
    if window_s <= 0:
        return {"requests_per_s": None, "output_tokens_per_s": None, "input_tokens_per_s": None}
    ok = requests.filter(pl.col("status") == "ok")
    out_tokens = chunks["n_tokens"].fill_null(1).sum() if chunks.height else 0
    in_tokens = ok.select(prompt_tokens().sum()).item() if ok.height else 0
    return {
        "requests_per_s": ok.height / window_s,
        "output_tokens_per_s": float(out_tokens) / window_s,
        "input_tokens_per_s": float(in_tokens or 0) / window_s,
    }


def _ttft_section(table: pl.DataFrame) -> dict[str, object]:
    by_bucket: dict[str, object] = dict(ttft.ttft_by_bucket(table))
    by_bucket["all"] = ttft.ttft_all(table)
    return {
        "ttft_s": by_bucket,
        "ttft_by_class_s": ttft.ttft_by_class(table),
        "ttft_breakdown_s": ttft.breakdown_by_bucket(table),
    }


def _itl_section(chunks: pl.DataFrame, requests: pl.DataFrame, gaps: pl.DataFrame) -> dict[str, object]:
    steady = itl.steady(gaps)
    return {
        "itl_s": itl.pooled(steady),
        "itl_all_s": itl.pooled(gaps),
        "itl_per_token_s": itl.per_token(steady),
        "tpot_s": itl.tpot(itl.tpot_table(chunks, requests).filter(~pl.col("injected"))),
        "bundling": itl.bundling(chunks),
    }


def summarize(
    tables: Mapping[str, pl.DataFrame],
    window: RunWindow,
    slos: SloSet | None = None,
    stall_params: StallParams | None = None,
    thresholds: ValidityThresholds | None = None,
) -> dict[str, object]:
    """Every metric of one run over its measurement window (see the module docstring for keys)."""
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
    itl_section = _itl_section(chunks, requests, gaps)
    validity = check_validity(ttft_rows, t["client_samples"], itl_section["itl_s"],  # type: ignore[arg-type]
                              thresholds, t["client_pauses"], client_stalls,
                              tag_gaps(itl.steady(gaps), t["all_chunks"], all_requests, t["client_pauses"]))
    out: dict[str, object] = {
        "window": {
            "run_start_ns": window.run_start_ns,
            "measure_start_ns": window.measure_start_ns,
            "end_ns": window.end_ns,
            "seconds": window.seconds,
        },
        **_ttft_section(ttft_rows),
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
                       "prompt_tokens": prompt_token_check(requests)},
        "definitions": dict(DEFINITIONS),
    }
    return json_safe(out)  # type: ignore[return-value]


def _window_from(meta: dict[str, object]) -> RunWindow:
    for key in ("run_start_ns", "end_ns"):
        if not isinstance(meta.get(key), int):
            raise ConfigError(
                "run.json",
                f"{key} is missing or not an integer",
                "the run store writes it; rerun or fix the file",
            )
    start = int(meta["run_start_ns"])  # type: ignore[call-overload]
    measure = meta.get("measure_start_ns")
    return RunWindow(start, int(measure) if isinstance(measure, int) else start, int(meta["end_ns"]))  # type: ignore[call-overload]


def _stall_params(meta: dict[str, object]) -> StallParams:
    d = StallParams()
    factor = meta.get("stall_factor")
    floor = meta.get("stall_floor_s")
    return StallParams(
        factor=float(factor) if factor is not None else d.factor,  # type: ignore[arg-type]
        floor_s=float(floor) if floor is not None else d.floor_s,  # type: ignore[arg-type]
    )


def analyze_run(run_dir: str | Path) -> dict[str, object]:
    """Summarize a stored run (reads run.json and the table directories; writes nothing)."""
    path = Path(run_dir, "run.json")
    if not path.is_file():
        raise ConfigError("run_dir", f"{path} not found", "pass a directory written by `itlbench run`")
    meta = json.loads(path.read_text())
    slo = meta.get("slo")
    return summarize(
        load_tables(run_dir),
        _window_from(meta),
        parse_slo(slo if isinstance(slo, str) else None),
        _stall_params(meta),
    )
