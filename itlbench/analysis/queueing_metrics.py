"""Why requests waited for an external engine, from its own /metrics (no step log to charge steps to).

Behind --endpoint the harness sees no engine steps, only the /metrics reads (server_metrics): two at the
window's edges, and every --scrape-interval between them if asked. What those reads can say:
  queue time  the engine's queue-time histogram, its increase between the reads nearest the window's edges
              (resets handled): the mean (_sum / _count) and the bucket bound the 99th percentile lies under.
              vLLM and itlbench observe a request's queue time when it finishes, so these are the requests
              that ended between the reads, not those sent in the window.
  preemptions the engine's counter over the same reads.
  held        at each periodic read inside the window: were requests waiting, how many ran then, how full
              K/V was. A running count that sits at one value whenever requests wait is the batch's cap;
              it is named max_num_seqs only where the run knows that setting (run.json), never guessed.
Names (vLLM's vllm/v1/metrics/loggers.py, SGLang's python/sglang/srt/metrics/collector.py, llama.cpp's
tools/server/server.cpp /metrics; itlbench serve's server/metrics.py mirrors vLLM's):
  vLLM      vllm:request_queue_time_seconds, vllm:num_preemptions_total, vllm:num_requests_running,
            vllm:num_requests_waiting, vllm:kv_cache_usage_perc (before 0.9 vllm:gpu_cache_usage_perc)
  SGLang    sglang:queue_time_seconds, sglang:num_retracted_requests_total (its preemption),
            sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage
  llama.cpp llamacpp:requests_processing (busy slots), llamacpp:requests_deferred (no slot free),
            llamacpp:kv_cache_usage_ratio (older builds); no queue-time histogram, no preemptions
Gauges of several series (vLLM's data-parallel engines, SGLang's DP ranks) are summed per read, K/V
usage averaged. Without any of these names the answer is None.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from itlbench.analysis.queueing import KV_FULL
from itlbench.analysis.split import counter_increase
from itlbench.analysis.stats import json_safe, min_samples
from itlbench.analysis.window import RunWindow

HELD_SHARE = 0.8  # of the reads with requests waiting, at one running count: the batch held at that count
HELD_MIN_READS = 2  # one read with requests waiting says what ran then, not what the batch held


@dataclass(frozen=True)
class EngineNames:
    """One engine's series: the first present of each tuple is read."""

    label: str  # how the report names the server
    queue_hist: str | None  # histogram base name (its _sum, _count, _bucket)
    preemptions: tuple[str, ...]
    running: str
    waiting: str
    kv_usage: tuple[str, ...]

    def names(self) -> set[str]:
        hist = {self.queue_hist + s for s in ("_sum", "_count", "_bucket")} if self.queue_hist else set()
        return hist | set(self.preemptions) | {self.running, self.waiting} | set(self.kv_usage)


ENGINES: dict[str, EngineNames] = {
    "vllm": EngineNames("vLLM", "vllm:request_queue_time_seconds",
                        ("vllm:num_preemptions_total", "vllm:num_preemptions"), "vllm:num_requests_running",
                        "vllm:num_requests_waiting", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "sglang": EngineNames("SGLang", "sglang:queue_time_seconds", ("sglang:num_retracted_requests_total",),
                          "sglang:num_running_reqs", "sglang:num_queue_reqs", ("sglang:token_usage",)),
    "llamacpp": EngineNames("llama.cpp", None, (), "llamacpp:requests_processing", "llamacpp:requests_deferred",
                            ("llamacpp:kv_cache_usage_ratio",)),
    "itlbench": EngineNames("itlbench serve", "itlbench_request_queue_time_seconds",
                            ("itlbench_num_preemptions_total",), "itlbench_num_requests_running",
                            "itlbench_num_requests_waiting", ("itlbench_kv_cache_usage_perc",)),
}


def engine_of(samples: pl.DataFrame) -> str | None:
    """The first engine whose queueing series the reads hold."""
    present = set(samples["name"].unique().to_list()) if samples.height else set()
    return next((key for key, e in ENGINES.items() if e.names() & present), None)


def queue_histogram(inc: pl.DataFrame, base: str) -> dict[str, object] | None:
    """{count, sum_s, mean_s, p99_le, p99_above, max_le}: a histogram's increase over the window; the bounds
    are the smallest bucket edge holding 99% (p99_le, null under 100 observations, as for every p99 here) and
    all of them (max_le); past the last finite edge, p99_above / max_le null."""
    counts = inc.filter(pl.col("name") == base + "_count")
    if not counts.height:
        return None
    count = float(counts["increase"].sum())
    total = float(inc.filter(pl.col("name") == base + "_sum")["increase"].sum())
    le = pl.col("labels").str.json_path_match("$.le")
    buckets = (inc.filter(pl.col("name") == base + "_bucket")
               .with_columns(pl.when(le.str.contains("Inf")).then(float("inf"))
                             .otherwise(le.cast(pl.Float64, strict=False)).alias("le"))
               .drop_nulls("le").group_by("le").agg(pl.col("increase").sum()).sort("le"))
    finite = [b for b in buckets["le"].to_list() if b != float("inf")]

    def bound(share: float) -> float | None:
        hit = buckets.filter(pl.col("increase") >= share * count - 1e-9)
        return float(hit["le"][0]) if hit.height and count > 0 else None

    p99 = bound(0.99)
    return {"count": int(round(count)), "sum_s": total, "mean_s": total / count if count > 0 else None,
            "p99_le": p99 if count >= min_samples(0.99) else None,
            "p99_above": finite[-1] if p99 == float("inf") and finite else None, "max_le": bound(1.0)}


def _first(names: tuple[str, ...], present: set[str]) -> str | None:
    return next((n for n in names if n in present), None)


def read_times(samples: pl.DataFrame, scrapes: pl.DataFrame, window: RunWindow) -> list[int]:
    """The periodic reads inside the window (their rows' t_ns); every read inside it where the run kept no
    scrapes table."""
    inside = samples.filter(pl.col("t_ns").is_between(window.measure_start_ns, window.end_ns, closed="left"))
    times = set(inside["t_ns"].unique().to_list())
    if scrapes.height:
        periodic = scrapes.filter((pl.col("reason") == "periodic") & (pl.col("status") == "ok"))
        times &= set(periodic["start_ns"].to_list())
    return sorted(times)


def held_at_reads(samples: pl.DataFrame, names: EngineNames, times: list[int]) -> dict[str, object] | None:
    """{reads, waiting_reads, waiting_mean, running_mode, running_mode_reads, running_range (while waiting),
    running_held, running_max (at any read), kv_usage_waiting}: the gauges at each periodic read; None without reads of the waiting gauge. `running_held`:
    the running count at HELD_SHARE of the reads with requests waiting, and never above it at any read (a read
    between a request's finish and the next admission sees one fewer)."""
    at = samples.filter(pl.col("t_ns").is_in(times))
    present = set(at["name"].unique().to_list())
    kv = _first(names.kv_usage, present)
    if names.waiting not in present:
        return None

    def per_read(name: str | None, how: str) -> dict[int, float]:
        rows = at.filter(pl.col("name") == name).group_by("t_ns").agg(getattr(pl.col("value"), how)())
        return dict(rows.iter_rows())

    waiting, running = per_read(names.waiting, "sum"), per_read(names.running, "sum")
    usage = per_read(kv, "mean") if kv else {}
    held = [t for t in waiting if waiting[t] > 0]
    ran = Counter(int(running[t]) for t in held if t in running)
    mode, mode_reads = max(ran.items(), key=lambda kv: (kv[1], kv[0])) if ran else (None, 0)  # ties: the larger
    most = int(max(running.values())) if running else None
    kv_held = [usage[t] for t in held if t in usage]
    return {"reads": len(waiting), "waiting_reads": len(held),
            "waiting_mean": sum(waiting[t] for t in held) / len(held) if held else None,
            "running_mode": mode, "running_mode_reads": mode_reads,
            "running_range": [min(ran), max(ran)] if ran else None,
            "running_held": mode if mode is not None and len(held) >= HELD_MIN_READS and mode_reads >= HELD_SHARE * len(held)
            and mode == most else None,
            "running_max": most,
            "kv_usage_waiting": sum(kv_held) / len(kv_held) if kv_held else None}


def queueing_from_metrics(samples: pl.DataFrame, scrapes: pl.DataFrame, window: RunWindow,
                          max_num_seqs: int | None = None, window_requests: int | None = None) -> dict[str, object] | None:
    """summary.json's `queueing` for an engine known by its /metrics alone: {source "server_metrics", engine,
    label, max_num_seqs, waiting_share (of the periodic reads, null without them), main_limit, queue_time_s,
    window_requests (sent in the window: what the histogram's count, of requests that finished between the
    reads, is read against), preemptions, periodic, metrics}; None where the reads hold none of the series above."""
    key = engine_of(samples)
    if key is None:
        return None
    names = ENGINES[key]
    ours = samples.filter(pl.col("name").is_in(sorted(names.names())))
    present = set(ours["name"].unique().to_list())
    inc = counter_increase(ours.filter(~pl.col("name").is_in([names.running, names.waiting, *names.kv_usage])),
                           window)
    hist = queue_histogram(inc, names.queue_hist) if names.queue_hist else None
    preempt_name = _first(names.preemptions, present)
    preempted = inc.filter(pl.col("name") == preempt_name) if preempt_name else inc.clear()
    held = held_at_reads(ours, names, read_times(ours, scrapes, window))
    if held is not None and not held["reads"]:
        held = None
    main = None
    if held and held["waiting_reads"]:
        if max_num_seqs is not None and held["running_held"] == max_num_seqs:
            main = "max_num_seqs"
        elif (held["kv_usage_waiting"] or 0.0) >= KV_FULL:
            main = "kv_cache"
    return json_safe({
        "source": "server_metrics",
        "engine": key,
        "label": names.label,
        "max_num_seqs": max_num_seqs,
        "waiting_share": held["waiting_reads"] / held["reads"] if held else None,  # type: ignore[operator]
        "main_limit": main,
        "queue_time_s": hist,
        "window_requests": window_requests,
        "preemptions": int(round(float(preempted["increase"].sum()))) if preempted.height else None,
        "periodic": held,
        "metrics": sorted(present),
    })  # type: ignore[return-value]
