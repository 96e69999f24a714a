"""Why requests waited for the engine: for each step that left requests waiting, the limit that held them.

TTFT's `queue` part (sent → first prefill step) says how long requests waited, not why, and a capacity search
that ends on a TTFT miss needs the why: raising --max-num-seqs helps one cause, a smaller chunk budget another,
more K/V memory a third. A step that ends with requests still waiting is charged, for its duration, to the
first limit that applies:
  max_num_seqs  the running batch was at its cap when the step was scheduled (running + finished in it ≥ cap)
  kv_cache      the step preempted a request, or K/V blocks were nearly all in use (≥ KV_FULL)
  token_budget  the step's tokens filled its budget (a long prefill, or many decodes, took it)
  other         none of these: a request that arrived during the step waits for the next one; a policy's order
Engine step logs only (the bundled engine, the simulator, `itlbench serve`): without them the summary says null.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from itlbench.analysis.stats import describe, ns_to_s

LIMITS: tuple[str, ...] = ("max_num_seqs", "kv_cache", "token_budget", "other")
KV_FULL = 0.98  # block usage at which admitting one more prompt needs a preemption
QUEUE_KEYS: tuple[str, ...] = ("p50", "p90", "p99", "max", "count")
_NEEDED = ("num_waiting", "num_running", "num_finished", "num_preemptions", "kv_usage", "prefill_tokens",
           "decode_tokens", "token_budget", "start_ns", "end_ns")


def max_num_seqs_of(meta: Mapping[str, object]) -> int | None:
    """The engine's running-batch cap from run.json: the bundled or simulated engine's, `itlbench serve`'s own
    report of itself behind --endpoint, or the setting a `sweep --serve` point filled into its server's command
    ({max_num_seqs}, kept as typed); None where neither says."""
    eng = meta.get("engine")
    inner = (eng.get("engine") or (eng.get("itlbench") or {}).get("engine")) if isinstance(eng, dict) else None
    cap = inner.get("max_num_seqs") if isinstance(inner, dict) else None
    if cap is None:
        sweep = meta.get("sweep")
        settings = sweep.get("settings") if isinstance(sweep, dict) else None
        typed = settings.get("max_num_seqs") if isinstance(settings, dict) else None
        cap = int(typed) if isinstance(typed, str) and typed.strip().isdigit() else typed
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def step_limits(steps: pl.DataFrame, max_num_seqs: int | None) -> pl.DataFrame:
    """The steps that left requests waiting, each with its `limit` and `seconds`."""
    cap = pl.lit(max_num_seqs if max_num_seqs is not None else 2**62)
    budget = pl.col("token_budget").fill_null(2**62)
    limit = (pl.when(pl.col("num_running") + pl.col("num_finished") >= cap).then(pl.lit("max_num_seqs"))
             .when((pl.col("num_preemptions") > 0) | (pl.col("kv_usage") >= KV_FULL)).then(pl.lit("kv_cache"))
             .when(pl.col("prefill_tokens") + pl.col("decode_tokens") >= budget).then(pl.lit("token_budget"))
             .otherwise(pl.lit("other")))
    return (steps.filter(pl.col("num_waiting") > 0)
            .select(limit.alias("limit"), ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("seconds")))


def queueing_summary(steps: pl.DataFrame, ttft_rows: pl.DataFrame, window_s: float,
                     max_num_seqs: int | None) -> dict[str, object] | None:
    """{source, max_num_seqs, waiting_s, waiting_share, by_limit_s.<limit>, main_limit, queue_s.{p50,p90,p99,max,
    count}}; None without an engine step log that counts its queue."""
    if steps.is_empty() or any(c not in steps.columns for c in _NEEDED):
        return None
    held = step_limits(steps, max_num_seqs)
    seconds = dict(held.group_by("limit").agg(pl.col("seconds").sum()).iter_rows())
    by_limit = {name: float(seconds.get(name, 0.0)) for name in LIMITS}
    waiting_s = sum(by_limit.values())
    return {
        "source": "engine_steps",
        "max_num_seqs": max_num_seqs,
        "waiting_s": waiting_s,
        "waiting_share": waiting_s / window_s if window_s > 0 else None,
        "by_limit_s": by_limit,
        "main_limit": max(by_limit, key=by_limit.__getitem__) if waiting_s > 0 else None,
        "queue_s": describe(ttft_rows.filter(pl.col("ttft_s").is_not_null()), "queue_s", QUEUE_KEYS),
    }
