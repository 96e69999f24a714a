"""One run's analysis as a JSON-ready dict with stable keys (no NaN anywhere; unknown = null).

Keys (<bucket> ∈ le128, le512, le2k, le8k, le32k, gt32k; every bucket always present):
  window.{run_start_ns,measure_start_ns,end_ns,seconds}
  ttft_s.<bucket>.{p50,p90,p99,max,mean,count}        ttft_s.all.{same}
  ttft_by_class_s.<cls>.{same}
  ttft_breakdown_s.<bucket>.{client_lag_p50,queue_p50,prefill_p50,server_p50,queue_p99}
  itl_s.{p50,p90,p95,p99,p999,max,mean,count}          pooled gaps, steady streams (not injected)
  itl_s.max_not_client  the worst gap (or stream frozen at the window's end) that was not the client's own pause
  itl_all_s.{same}                                     pooled gaps, all streams
  itl_per_token_s.{same}                               per-token view, steady streams
  tpot_s.{p50,p90,p99,mean,count}                      per-request mean, steady streams
  stalls.{count,stalled_s (stream-seconds: summed over streams),worst_s,victims (distinct requests),events,
         events_with_injected_prefill,attribution_source,params,overlapping_scrape,stalled_unit,victims_unit}
  stalls.open.{count,stalled_s,at_window_end}  stalls no token closed (the stream froze; censored at the window's
                                               end or the cut), counted in every other stall figure too
  stalls.by_cause.<prefill|scrape|client|preemption|engine|outside_engine|unknown>.{count,stalled_s}  every
                    stall in exactly one cause: they sum to count and stalled_s
  stalls.by_unknown_reason.<no_step_log|no_steps>.{count,stalled_s}
  stalls.attribution[]  top events, the most stream-seconds stalled first: {event,start_s (from measure start),
                        span_s,stalls,victims,worst_s,stalled_s,prefill_steps,prefill_tokens,prefill_s,injected_prefill,prefill_request_ids,
                        injected_request_ids,longest_step_s,preemptions,client_pause_s,scrape_s,cause}
  queueing  what held the requests that waited for the engine. From a step log (source engine_steps):
           {source,max_num_seqs,waiting_s,waiting_share,main_limit,by_limit_s.<max_num_seqs|kv_cache|token_budget|
           other>,queue_s.{p50,p90,p99,max,count}} (analysis/queueing.py); else from an external engine's /metrics
           (source server_metrics): {source,engine,label,max_num_seqs,waiting_share (of periodic reads),main_limit,
           queue_time_s.{count,sum_s,mean_s,p99_le,p99_above,max_le},preemptions,periodic.{reads,waiting_reads,
           waiting_mean,running_mode,running_mode_reads,running_range,running_held,running_max,kv_usage_waiting},
           metrics} (analysis/queueing_metrics.py); null with neither
  split.{prefill_s,decode_s,prefill_frac,source}  (+ mixed_steps, cost_model | unattributed_s)
  throughput.{requests_per_s,output_tokens_per_s,input_tokens_per_s}
  offered  null for a closed-loop run; else the open-loop arrivals scheduled in the window against the nominal
           --rate: {nominal_rps,arrivals,window_s,offered_rps,expected_arrivals,shortfall,count_noise,completed,
           achieved_rps,line,note} (analysis/offered.py)
  goodput.{requests_per_s,fraction,good,total,not_ok,slos}
  goodput.misses[]  every SLO requests missed: {slo (ttft|itl_p99|itl_max),cls,bucket,target_s,missed,of,
                    median_s,worst_s}
  requests.{total,ok,error,timeout,cancelled,injected,outside_window,outside_window_failed,in_flight_at_start,
           in_flight_at_start_failed}  (in_flight_at_start: sent in the warm-up, still streaming or frozen when
           the window opened; their in-window gaps and stalls count)
  failures.{count,total,by_kind.<kind>.{count,example},line}  failed requests by requests.error_kind
  cache.{requests_reporting,prompt_tokens,cached_tokens,cached_fraction,injected[],server,warnings,preemptions}
                    (preemptions: the engine's in the window; a preempted request's re-prefill hits the cache)
  scrapes.{count,failed,by_reason,in_window,longest_s,total_s}  /metrics reads of an external engine
  client_pauses.{count,wall_s,measured_wall_s,cpu_s,runq_s,starved_fraction,line}  the client's loop pauses
  gpu.nvml  'NVML', or 'no NVML: <why>' alone; with NVML also gpu.{samples,power_w_mean,sm_util_mean,
            mem_util_mean,energy_j,energy_per_output_token_j}  (the window's NVML samples, analysis/gpu.py)
  bundling.{fraction,chunks,bundled_chunks,tokens_per_chunk,warn_fraction,warning}
  arrived_together.{gaps,zero_gaps,fraction,warn_fraction,warning}  steady gaps of 0 s: above warn_fraction
                    the tokens came in together (a buffering proxy) and validity withdraws ITL
  reasoning  null unless some request of the window reasoned (streamed delta.reasoning[_content]); then
             {requests,answered,request_share,chunk_share,ttfa_s.<bucket|all>.{TTFT keys},ttfa_by_class_s.<cls>,
             reasoning_s.{TTFT keys},itl_reasoning_s.{ITL keys},itl_answer_s.{ITL keys},handoff_s.{TTFT keys}}
             (analysis/reasoning.py: TTFT to the first answer token, each phase's pooled steady gaps)
  valid, validity.{reasons,affected,standing,disturbances,figures,thresholds}  (each client delay judged
                    against the figure it distorts; `affected` names keys, `standing` the headline figures
                    that hold; `disturbances` the reasons from outside the client: cut connections, late
                    delivery of first tokens; analysis/disturbance.py)
  unreadable_parts  part files whose parquet footer does not read (relative paths), left out of every figure
Percentiles their samples cannot support (fewer than 1/(1−q): 2 for p50, 10 for p90, 100 for p99,
1,000 for p99.9) are null beside their `count` (itlbench.analysis.stats).
  definitions.{ttft,itl,stall,split,prompt_buckets,goodput,validity,window,percentiles}
  crosscheck.engine.{source,longest_step_s (of the run),worst_client_gap_s,worst_gap_over_longest_step,worst_gap_request_id,
                    worst_gap_steps,worst_gap_engine_busy_s,worst_gap_longest_step_s,worst_gap_unexplained_s,injected[]}
  crosscheck.prompt_tokens.{checked,exact,max_abs_diff,reported_over_planned}
  crosscheck.output_tokens.{checked,exact,counted,reported,unseen,unseen_share,counted_over_reported}
  crosscheck.server_timings.{source,requests,ttft_minus_prompt_ms,ttft_below_server_prompt,
    decode_minus_server_ms,tokens_agree} (null unless the server reports per-request timings: llama.cpp)
  clock.{kind,note}  only on a virtual clock (harness/virtual_run.py)
  sim_check.{gpu,label,format,tp,held_out,at_tp,kv_share,tight,reserve_gib,memory_gib}  only for the simulated
                    engine: its preset's error on the published figures held out of the fit (sim/accuracy.py;
                    held_out null where no figure checks it), and where its K/V room is tight, the error of the
                    published runs as tight and the reserve a runtime would keep of that room
Throughput: ok requests scheduled in the window, output tokens that arrived in the window (Σ n_tokens
of every stream's chunks), prompt tokens of ok requests, each divided by the window's seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from itlbench.analysis import itl, reasoning, ttft
from itlbench.analysis.buckets import prompt_tokens
from itlbench.analysis.cache import cache_summary
from itlbench.analysis.crosscheck import engine_check, output_token_check, prompt_token_check
from itlbench.analysis.definitions import DEFINITIONS
from itlbench.analysis.disturbance import live_in
from itlbench.analysis.failures import failure_summary
from itlbench.analysis.goodput import SloSet, goodput, judge, parse_slo
from itlbench.analysis.gpu import gpu_status_of, gpu_summary
from itlbench.analysis.offered import offered_load
from itlbench.analysis.partitions import chunk_parts
from itlbench.analysis.pooled import describe_pooled
from itlbench.analysis.queueing import max_num_seqs_of, queueing_summary
from itlbench.analysis.queueing_metrics import queueing_from_metrics
from itlbench.analysis.read_together import tag_gaps
from itlbench.analysis.run_doc import check_run_doc
from itlbench.analysis.scale import ChunkFigures, chunk_figures
from itlbench.analysis.scrapes import scrape_summary
from itlbench.analysis.server_timings import server_timings_check
from itlbench.analysis.split import time_split
from itlbench.analysis.stalls import (
    StallParams,
    StallReport,
    analyze_found_stalls,
    analyze_stalls,
    steps_reaching,
)
from itlbench.analysis.starvation import pause_breakdown
from itlbench.analysis.stats import json_safe
from itlbench.analysis.validity import StampCounts, ValidityThresholds, check_validity
from itlbench.analysis.window import RunWindow, select_window
from itlbench.errors import ConfigError
from itlbench.rundir import TABLES, empty, read_run_doc, read_table, unreadable_parts
from itlbench.rundir.reader import conform

STATUSES = ("ok", "error", "timeout", "cancelled")


def request_counts(requests: pl.DataFrame, all_requests: pl.DataFrame | None = None,
                   measure_start_ns: int | None = None) -> dict[str, int]:
    """Counts by status of the measured window's requests, and how many were sent outside it (warm-up)
    and failed there: a run aborted in its warm-up measured none, and must still say what failed. Of
    those, `in_flight_at_start` were sent in the warm-up but still streaming (or frozen) when the window
    opened: their gaps and stalls in the window count in its ITL and stall figures, so they are not
    warm-up only (`in_flight_at_start_failed`: those that then did not finish ok)."""
    out = {"total": requests.height}
    for status in STATUSES:
        out[status] = requests.filter(pl.col("status") == status).height
    out["injected"] = requests.filter(pl.col("injected").fill_null(False)).height
    if all_requests is not None:
        outside = all_requests.join(requests.select("request_id"), on="request_id", how="anti")
        out["outside_window"] = outside.height
        out["outside_window_failed"] = outside.filter(pl.col("status") != "ok").height
        if measure_start_ns is not None:
            carried = outside.filter((pl.col("scheduled_ns") < measure_start_ns)
                                     & (pl.coalesce("done_ns", "last_token_ns") >= measure_start_ns))
            out["in_flight_at_start"] = carried.height
            out["in_flight_at_start_failed"] = carried.filter(pl.col("status").fill_null("") != "ok").height
    return out


def throughput(requests: pl.DataFrame, chunks: pl.DataFrame | None, window_s: float,
               out_tokens: int = 0) -> dict[str, float | None]:
    """`out_tokens` stands in for the window's chunks (None) when a large run summed them part by part."""
    if window_s <= 0:
        return {"requests_per_s": None, "output_tokens_per_s": None, "input_tokens_per_s": None}
    ok = requests.filter(pl.col("status") == "ok")
    if chunks is not None:
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
        "arrived_together": itl.arrived_together(steady),
    }


def summarize(
    tables: Mapping[str, pl.DataFrame],
    window: RunWindow,
    slos: SloSet | None = None,
    stall_params: StallParams | None = None,
    thresholds: ValidityThresholds | None = None,
    gpu_status: str | None = None,
    plan: Mapping[str, object] | None = None,
    max_num_seqs: int | None = None,
) -> dict[str, object]:
    """Every metric of one run over its measurement window (see the module docstring for keys);
    `gpu_status` is run.json's `gpu_telemetry.nvml` (why a run has no GPU samples), `plan` its load plan,
    `max_num_seqs` the engine's running-batch cap (what held its queue)."""
    slos = slos or SloSet()
    stall_params = stall_params or StallParams()
    t = select_window(tables, window)
    requests, chunks, steps = t["requests"], t["chunks"], t["steps"]
    ttft_rows = ttft.ttft_table(requests, t["all_steps"])  # a window request may be prefilled after it closes
    all_requests = t["all_requests"]
    gaps = itl.gap_table(t["all_chunks"], all_requests).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    opened = itl.open_gap_table(t["all_chunks"], all_requests, window.measure_start_ns, window.end_ns)
    stall_gaps = itl.with_open(itl.steady(gaps), itl.steady(opened))
    stalls = analyze_stalls(stall_gaps, steps_reaching(t["all_steps"], stall_gaps, window.measure_start_ns, window.end_ns), all_requests,
                            stall_params, window.measure_start_ns, t["client_pauses"], t["scrapes"])
    client_stalls = int((stalls.summary.get("by_cause") or {}).get("client", {}).get("count", 0))  # type: ignore[union-attr]
    itl_section = _itl_section(chunks, requests, gaps)
    validity = check_validity(ttft_rows, t["client_samples"], itl_section["itl_s"],  # type: ignore[arg-type]
                              thresholds, t["client_pauses"], client_stalls,
                              tag_gaps(itl.steady(gaps), t["all_chunks"], all_requests, t["client_pauses"]),
                              requests=live_in(all_requests, window.measure_start_ns, window.end_ns), steps=steps,
                              together=itl_section["arrived_together"])  # type: ignore[arg-type]
    itl_section["itl_s"] = {**itl_section["itl_s"],  # type: ignore[dict-item]
                            "max_not_client": itl.worst_not_client(itl.steady(gaps), stalls.stalls)}
    windowed = t["all_chunks"].filter((pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    phased = reasoning.gap_phase(gaps, all_requests)
    itl_section["reasoning"] = reasoning.section(
        reasoning.request_table(ttft_rows, requests), requests, reasoning.pooled_phase(phased, "reasoning"),
        reasoning.pooled_phase(phased, "answer"), reasoning.handoff_rows(phased))
    judged = judge(ttft_rows, itl.gap_table(chunks, requests), slos)  # every gap of its own, the drain's too
    out = _assemble(window, ttft_rows, itl_section, stalls.summary, t, judged, slos, validity,
                    throughput(requests, windowed, window.seconds), engine_check(requests, chunks, t["all_steps"]), gpu_status,
                    offered=offered_load(all_requests, window, plan), max_num_seqs=max_num_seqs)
    return json_safe(out)  # type: ignore[return-value]


def summarize_dir(
    run_dir: str | Path,
    window: RunWindow,
    slos: SloSet | None = None,
    stall_params: StallParams | None = None,
    thresholds: ValidityThresholds | None = None,
    partitions: int | None = None,
    gpu_status: str | None = None,
    plan: Mapping[str, object] | None = None,
    max_num_seqs: int | None = None,
) -> tuple[dict[str, object], RunAnalysis]:
    """`summarize` of a stored run without holding its chunks (analysis/scale.py): the same keys and
    figures, pooled percentiles selected exactly out of core. Also returns what the report draws."""
    slos = slos or SloSet()
    stall_params = stall_params or StallParams()
    t = select_window({name: read_table(run_dir, name) for name in TABLES if name != "chunks"}, window)
    requests, steps, all_requests = t["requests"], t["steps"], t["all_requests"]
    ttft_rows = ttft.ttft_table(requests, t["all_steps"])  # a window request may be prefilled after it closes
    c = chunk_figures(run_dir, window, all_requests, requests, stall_params, partitions)
    stalls = analyze_found_stalls(c.stalls, steps_reaching(t["all_steps"], c.stalls, window.measure_start_ns, window.end_ns),  # type: ignore[arg-type]
                                  all_requests, stall_params,
                                  window.measure_start_ns, t["client_pauses"], t["scrapes"])
    client_stalls = int((stalls.summary.get("by_cause") or {}).get("client", {}).get("count", 0))  # type: ignore[union-attr]
    itl_section: dict[str, object] = {
        "itl_s": describe_pooled(c.itl, c.quantiles["itl_s"], itl.ITL_KEYS),
        "itl_all_s": describe_pooled(c.all_gaps(), c.quantiles["itl_all_s"], itl.ITL_KEYS),
        "itl_per_token_s": describe_pooled(c.per_token, c.quantiles["itl_per_token_s"], itl.ITL_KEYS),
        "tpot_s": itl.tpot(c.tpot.filter(~pl.col("injected"))),  # type: ignore[union-attr]
        "bundling": itl.bundling_of(c.chunks, c.bundled, c.tokens),
        "arrived_together": itl.arrived_together_of(c.steady_gaps, c.zero_gaps),
        "reasoning": reasoning.section(
            reasoning.request_table(ttft_rows, requests), requests,
            describe_pooled(c.reasoning_itl, c.quantiles["itl_reasoning_s"], itl.ITL_KEYS),
            describe_pooled(c.answer_itl, c.quantiles["itl_answer_s"], itl.ITL_KEYS), c.handoff),  # type: ignore[arg-type]
    }
    live = live_in(all_requests, window.measure_start_ns, window.end_ns)  # for what disturbed the window
    tagged = _tagged_gaps(run_dir, window, all_requests, t["client_pauses"]) if c.chunks <= TAG_MAX_CHUNKS else None
    if tagged is not None:  # who made each shared read late: only the client's lateness withdraws ITL
        validity = check_validity(ttft_rows, t["client_samples"], itl_section["itl_s"],  # type: ignore[arg-type]
                                  thresholds, t["client_pauses"], client_stalls, tagged, requests=live, steps=steps,
                                  together=itl_section["arrived_together"])  # type: ignore[arg-type]
    else:  # too large to hold every read: the counts' rule (shared reads, whoever caused them)
        late = c.quantiles["late_bound_s"]
        stamps = StampCounts(c.steady_gaps, c.kernel, c.shared, lambda q: late.get(str(q)))
        validity = check_validity(ttft_rows, t["client_samples"], itl_section["itl_s"],  # type: ignore[arg-type]
                                  thresholds, t["client_pauses"], client_stalls, stamps=stamps, requests=live,
                                  steps=steps, together=itl_section["arrived_together"])  # type: ignore[arg-type]
    judged = judge(ttft_rows, None, slos, c.request_itl)
    itl_section["itl_s"] = {**itl_section["itl_s"],  # type: ignore[dict-item]
                            "max_not_client": _worst_not_client(run_dir, window, all_requests, c.spans, stalls.stalls)}
    out = _assemble(window, ttft_rows, itl_section, stalls.summary, t, judged, slos, validity,
                    throughput(requests, None, window.seconds, c.out_tokens),
                    engine_check(requests, None, t["all_steps"], c.worst_gap), gpu_status, unreadable_parts(run_dir),
                    offered_load(all_requests, window, plan), max_num_seqs)
    return json_safe(out), RunAnalysis(c, stalls, ttft_rows, judged)  # type: ignore[return-value]


# read_together.tag_gaps needs every read of the run at once (which streams were read while another's
# bytes were due); up to this many chunk rows (~1 GB) it runs, above it validity uses the counts alone
TAG_MAX_CHUNKS = 2_000_000


def _tagged_gaps(run_dir: str | Path, window: RunWindow, all_requests: pl.DataFrame,
                 pauses: pl.DataFrame) -> pl.DataFrame:
    chunks = read_table(run_dir, "chunks")
    gaps = itl.gap_table(chunks, all_requests).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    return tag_gaps(itl.steady(gaps), chunks, all_requests, pauses)


def _worst_not_client(run_dir: str | Path, window: RunWindow, all_requests: pl.DataFrame, spans: pl.DataFrame,
                      stalls: pl.DataFrame) -> float | None:
    """`itl.worst_not_client` out of core: the few requests a client-caused stall hit are read again alone;
    every other steady request's longest gap is its span's."""
    held = stalls.filter(pl.col("cause") == "client")["request_id"].unique().to_list() if stalls.height else []
    rest = spans.filter(~pl.col("injected") & ~pl.col("request_id").is_in(held))["max_s"].max() if spans.height else None
    chunks = [conform(pl.scan_parquet(p).filter(pl.col("request_id").is_in(held)).collect(), TABLES["chunks"])
              for p in (chunk_parts(run_dir) if held else [])]
    gaps = itl.gap_table(pl.concat(chunks) if chunks else empty("chunks"), all_requests).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    found = [v for v in (rest, itl.worst_not_client(itl.steady(gaps), stalls)) if v is not None]
    return float(max(found)) if found else None  # type: ignore[arg-type]


@dataclass
class RunAnalysis:
    """What the report draws besides the summary: chunk-level frames, stalls with causes, TTFT rows,
    goodput's verdict per request."""

    chunks: ChunkFigures
    stalls: StallReport
    ttft: pl.DataFrame
    judged: pl.DataFrame


def _assemble(window: RunWindow, ttft_rows: pl.DataFrame, itl_section: dict[str, object],
              stall_summary: dict[str, object], t: dict[str, pl.DataFrame], judged: pl.DataFrame, slos: SloSet,
              validity: dict[str, object], thr: dict[str, float | None], engine: dict[str, object],
              gpu_status: str | None = None, unreadable: list[str] | None = None,
              offered: dict[str, object] | None = None, max_num_seqs: int | None = None) -> dict[str, object]:
    requests = t["requests"]
    out_tokens = (thr.get("output_tokens_per_s") or 0.0) * window.seconds
    return {
        "window": {
            "run_start_ns": window.run_start_ns,
            "measure_start_ns": window.measure_start_ns,
            "end_ns": window.end_ns,
            "seconds": window.seconds,
        },
        **_ttft_section(ttft_rows),
        **itl_section,
        "stalls": stall_summary,
        "queueing": queueing_summary(t["steps"], ttft_rows, window.seconds, max_num_seqs)
        or queueing_from_metrics(t["server_metrics"], t["scrapes"], window, max_num_seqs,
                                 int(ttft_rows.height)),
        "split": time_split(t["steps"], t["server_metrics"], window),
        "throughput": thr,
        "offered": offered,
        "goodput": goodput(judged, window.seconds, slos),
        "requests": request_counts(requests, t.get("all_requests"), window.measure_start_ns),
        "failures": failure_summary(requests),
        "cache": cache_summary(requests, t["server_metrics"], window, t["steps"], t.get("all_steps")),
        "scrapes": scrape_summary(t["scrapes"], window),
        "client_pauses": pause_breakdown(t["client_pauses"]),
        "gpu": gpu_summary(t["gpu_samples"], None, out_tokens, gpu_status),
        "valid": validity["valid"],
        "unreadable_parts": unreadable or [],  # record files left out (summarize_dir reads them from disk)
        "validity": {k: v for k, v in validity.items() if k != "valid"},
        "crosscheck": {"engine": engine, "prompt_tokens": prompt_token_check(requests),
                       "output_tokens": output_token_check(requests),
                       "server_timings": server_timings_check(requests)},
        "definitions": dict(DEFINITIONS),
    }


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


def analyze_run(run_dir: str | Path) -> dict[str, object]:
    """Summarize a stored run (reads run.json and the table directories; writes nothing into the run
    directory). Runs of any size: the chunks are read a partition of whole requests at a time
    (summarize_dir, analysis/scale.py), through temporary files in TMPDIR when the run has more than
    analysis.partitions.ROWS_PER_PARTITION chunk rows."""
    path = Path(run_dir, "run.json")
    if not path.is_file():
        raise ConfigError("run_dir", f"{path} not found", "pass a directory written by `itlbench run`")
    meta = read_run_doc(run_dir)
    check_run_doc(meta, run_dir)
    summary, analysis = summarize_meta(run_dir, meta, _window_from(meta))
    remember(run_dir, summary, analysis)
    return summary


def summarize_meta(run_dir: str | Path, meta: dict[str, object],
                   window: RunWindow) -> tuple[dict[str, object], RunAnalysis]:
    """`summarize_dir` as run.json asks (its SLOs, stall rule and why there are no GPU samples), with what
    a simulated engine's summary says besides: the report of a run with no summary.json is drawn from this,
    so it must say what `itlbench analyze` would."""
    check_run_doc(meta, run_dir)
    slo = meta.get("slo")
    plan = meta.get("plan")
    summary, analysis = summarize_dir(run_dir, window, parse_slo(slo if isinstance(slo, str) else None),
                                      StallParams.from_meta(meta), gpu_status=gpu_status_of(meta),
                                      plan=plan if isinstance(plan, dict) else None,
                                      max_num_seqs=max_num_seqs_of(meta))
    if isinstance(meta.get("sim_check"), dict):  # a simulated engine: its preset's published error bar
        summary["sim_check"] = meta["sim_check"]
    if meta.get("clock") == "virtual":  # harness.virtual_run: simulated time, no client to check
        summary["clock"] = {"kind": "virtual", "note": meta.get("clock_note")}
        validity = summary.get("validity")
        if isinstance(validity, dict):
            validity["client_checks"] = "not applicable: no client ran (virtual clock)"
    return summary, analysis


_LAST: dict[str, tuple[tuple[object, ...], dict[str, object], RunAnalysis]] = {}


def _fingerprint(run_dir: str | Path) -> tuple[object, ...]:
    """The inputs of an analysis: run.json and every table part (name, size, mtime)."""
    root = Path(run_dir)
    files = [root / "run.json", *sorted(root.glob("*/*.parquet"))]
    return tuple((str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())


def remember(run_dir: str | Path, summary: dict[str, object], analysis: RunAnalysis) -> None:
    """Keep the last analysis in this process, so `itlbench analyze` draws its report without a second
    pass over the chunks (one run only: the frames are small, the process may analyse many runs)."""
    _LAST.clear()
    _LAST[str(Path(run_dir).resolve())] = (_fingerprint(run_dir), summary, analysis)


def recall(run_dir: str | Path) -> tuple[dict[str, object], RunAnalysis] | None:
    """The analysis `remember` kept for this run, if its inputs have not changed since."""
    hit = _LAST.get(str(Path(run_dir).resolve()))
    if hit is None or hit[0] != _fingerprint(run_dir):
        return None
    return hit[1], hit[2]
