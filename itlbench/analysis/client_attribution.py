"""Stall attribution from the client's records alone: the step log's attribution, run on inferred steps.

Why: vLLM, SGLang and llama.cpp publish no step log, so their stalls were `outside_engine` or
unexplained. Every run has what the reconstruction needs (inferred_steps.py): kernel receive stamps
on every chunk, each request's send time, first token and `usage.prompt_tokens`. The inferred steps
carry the step log's columns, so `stalls.analyze_stalls` attributes them exactly as it does logged
steps, and the summary has the same fields (cause, prefill_request_ids, injected_request_ids, …) with
`attribution_source: client_inferred`.

What the client cannot see it does not claim. The step-log causes that need the engine's own account
are re-read (`unknown_reason` says why a gap stays unknown, or, for an inferred preemption, `skipped`: what it rests on;
summary `by_unknown_reason` counts the unknown ones):
  prefill, scrape, client   kept: a prefill that ended in a request's first token, the client's own
                            scrape log and pause log
  engine                    → unknown / silent: no stream advanced for most of the gap and no first
                            token ended it (one long engine step, or the server's HTTP layer or the
                            network: not told apart)
  outside_engine            → unknown / late_read when the gap's stamps may be late by half of it
                            (chunks read together), else preemption / skipped: other streams advanced
                            in ≥ `min_skipped` inferred steps while this one did not (a preemption, or
                            the server held this stream alone: the same from outside)
  no overlapping step       → unknown / no_steps (no other stream to infer steps from)
An event whose own cause is none of prefill, scrape, client takes the cause that carries most of its
stalled seconds over all reasons, then that cause's main reason (event_cause.py: the rule every source shares).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from itlbench.analysis.event_cause import KEPT, event_causes
from itlbench.analysis.inferred_steps import InferParams, InferredSteps, infer_steps
from itlbench.analysis.stalls import (
    StallParams,
    StallReport,
    analyze_stalls,
    by_unknown_reason,
    stall_summary,
)
from itlbench.analysis.stats import json_safe

SOURCE = "client_inferred"
REASONS: dict[str, str] = {
    "silent": "no stream advanced for most of the gap and no request's first token ended it",
    "late_read": "the gap's stamps may be late by half of it or more (chunks read together)",
    "skipped": "other streams advanced in inferred steps while this one did not (preemption, or the server "
               "held this stream alone)",
    "no_steps": "no inferred step overlaps it (no other stream to infer steps from)",
}


@dataclass(frozen=True)
class ClientStallReport:
    report: StallReport
    inferred: InferredSteps


def requests_for_attribution(requests: pl.DataFrame) -> pl.DataFrame:
    """Requests whose server sent no id are named by their client id (as the inferred steps name them)."""
    return requests.with_columns(pl.coalesce("server_request_id", "request_id").alias("server_request_id"))


def _skipped_steps(stalls: pl.DataFrame, inferred: InferredSteps) -> pl.Series:
    """Per stall: inferred steps that ended strictly inside its gap (a margin of one split each side)."""
    ends = np.sort(inferred.steps["end_ns"].to_numpy())
    margin = inferred.split_ns
    lo = np.searchsorted(ends, stalls["t_prev_ns"].to_numpy() + margin, side="right")
    hi = np.searchsorted(ends, stalls["t_ns"].to_numpy() - margin, side="left")
    return pl.Series("skipped_steps", np.maximum(hi - lo, 0), dtype=pl.Int64)


def _explain_stalls(stalls: pl.DataFrame, inferred: InferredSteps, min_skipped: int) -> pl.DataFrame:
    if stalls.is_empty():
        return stalls.with_columns(pl.lit(None, dtype=pl.Int64).alias("skipped_steps"),
                                   pl.lit(None, dtype=pl.Utf8).alias("unknown_reason"))
    frame = stalls.with_columns(_skipped_steps(stalls, inferred))
    late = (pl.col("late_bound_ns").fill_null(0) >= 0.5 * pl.col("gap_s") * 1e9) if "late_bound_ns" in frame.columns \
        else pl.lit(False)
    cause = pl.col("cause")
    reason = (pl.when(cause.is_in(KEPT)).then(pl.lit(None, dtype=pl.Utf8))
              .when(cause.is_null() | (cause == "unknown")).then(pl.lit("no_steps"))
              .when(cause == "engine").then(pl.lit("silent"))
              .when(late).then(pl.lit("late_read"))
              .when(pl.col("skipped_steps") >= min_skipped).then(pl.lit(None, dtype=pl.Utf8))
              .otherwise(pl.lit("silent")))
    return frame.with_columns(reason.alias("unknown_reason")).with_columns(
        pl.when(cause.is_in(KEPT)).then(cause)
        .when(pl.col("unknown_reason").is_null()).then(pl.lit("preemption"))
        .otherwise(pl.lit("unknown")).alias("cause"),
        pl.when(cause.is_in(KEPT)).then(pl.lit(None, dtype=pl.Utf8))
        .otherwise(pl.col("unknown_reason").fill_null("skipped")).alias("unknown_reason"))


def client_stalls(gaps: pl.DataFrame, chunks: pl.DataFrame, requests: pl.DataFrame, params: StallParams,
                  origin_ns: int = 0, pauses: pl.DataFrame | None = None, scrapes: pl.DataFrame | None = None,
                  infer: InferParams | None = None, min_skipped: int = 2) -> ClientStallReport:
    """Stalls attributed from inferred steps; `chunks`/`requests` whole (a prefill may start in warmup),
    `gaps` those to judge (steady streams in the window, as the step-log attribution takes them)."""
    inferred = infer_steps(chunks, requests, infer)
    named = requests_for_attribution(requests)
    base = analyze_stalls(gaps, inferred.steps, named, params, origin_ns, pauses, scrapes)
    stalls = _explain_stalls(base.stalls, inferred, min_skipped)
    events = event_causes(base.events, stalls)
    summary = stall_summary(stalls, events, inferred.steps, params, origin_ns)
    summary["attribution_source"] = SOURCE if inferred.steps.height else "unavailable"
    reasons = dict(zip(events["event"].to_list(), events["unknown_reason"].to_list(), strict=True)) \
        if events.height else {}
    for record in summary.get("attribution") or []:  # type: ignore[union-attr]
        record["unknown_reason"] = reasons.get(record["event"])
    summary["by_unknown_reason"] = by_unknown_reason(stalls)
    summary["unknown_reasons"] = dict(REASONS)
    summary["inferred"] = inferred.summary()
    summary["inferred_figures"] = ["by_cause", "attribution", "prefill_tokens (estimated from usage.prompt_tokens)",
                                   "longest_step_s (inferred step spacing)", "inferred"]
    return ClientStallReport(StallReport(stalls, events, json_safe(summary)), inferred)  # type: ignore[arg-type]


def client_only(tables: Mapping[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """The run's tables as a client-only analysis may read them: no step log, no server telemetry."""
    out = dict(tables)
    for name in ("steps", "server_metrics"):
        if name in out:
            out[name] = out[name].clear()
    return out
