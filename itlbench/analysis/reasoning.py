"""Reasoning streams: time to the first answer token, and each phase's inter-token latency.

A reasoning model streams its reasoning (`delta.reasoning` / `delta.reasoning_content`) before the
answer (content or tool calls). The client counts both as token chunks, so TTFT is the time to the
first *output* token, reasoning included; per request it also records `first_answer_ns` (the first
chunk that is not reasoning) and `reasoning_chunks`. A request *reasoned* when reasoning_chunks > 0.
Over the window's requests that reasoned:

  ttfa       time to first answer token = first_answer_ns − scheduled_ns (charged from the scheduled
             send, as TTFT is); requests that never answered (cut during reasoning) have none
  reasoning  first_answer_ns − first_token_ns: how long the reasoning held the answer back
  phase      of a chunk: reasoning if it arrived before the request's first answer chunk
             (t_ns < first_answer_ns), else answer; a gap takes the phase of the chunk that closes it,
             so the gap that crosses into the answer (last reasoning chunk → first answer chunk) is
             the answer phase's first gap. It is also reported alone, one per request (`handoff`).
             A reasoning chunk read together with the first answer chunk (one kernel stamp for both)
             counts as answer; the gap between them is 0 either way.
  ITL        pooled gaps of each phase, steady streams (not injected), in the window, like `itl_s`.

Requests that did not reason are in neither phase (their gaps are all answer, already in `itl_s`).
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.analysis.itl import ITL_KEYS
from itlbench.analysis.stats import describe, describe_by, ns_to_s
from itlbench.analysis.ttft import TTFT_KEYS

PHASES: tuple[str, ...] = ("reasoning", "answer")


REASONED = pl.col("reasoning_chunks").fill_null(0) > 0


def _tags(requests: pl.DataFrame) -> pl.DataFrame:
    """request_id → first_answer_ns of the requests that reasoned, marked `_reasoned`."""
    if "reasoning_chunks" not in requests.columns:
        return pl.DataFrame(schema={"request_id": pl.Utf8, "first_answer_ns": pl.Int64, "_reasoned": pl.Boolean})
    return requests.filter(REASONED).select("request_id", "first_answer_ns", pl.lit(True).alias("_reasoned"))


def gap_phase(gaps: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """`gaps` (itl.gap_table rows) with `phase`: reasoning | answer for requests that reasoned, null
    for the others; and `handoff`: true for the gap that closes on the first answer chunk."""
    tagged = gaps.join(_tags(requests), on="request_id", how="left")
    answer = pl.col("first_answer_ns").is_not_null() & (pl.col("t_ns") >= pl.col("first_answer_ns"))
    return tagged.with_columns(
        pl.when(pl.col("_reasoned").is_null()).then(pl.lit(None, dtype=pl.Utf8))
        .when(answer).then(pl.lit("answer")).otherwise(pl.lit("reasoning")).alias("phase"),
        (answer & (pl.col("t_prev_ns") < pl.col("first_answer_ns"))).fill_null(False).alias("handoff"),
    ).drop("first_answer_ns", "_reasoned")


def handoff_rows(phased: pl.DataFrame) -> pl.DataFrame:
    """One row per request (steady): request_id, gap_s of the gap that crossed into the answer."""
    return phased.filter(pl.col("handoff") & ~pl.col("injected")).select("request_id", "gap_s")


def request_table(ttft_rows: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """The window's requests that reasoned: ttft_table's columns plus ttfa_s and reasoning_s."""
    if "reasoning_chunks" not in requests.columns:
        return ttft_rows.head(0).with_columns(pl.lit(None, dtype=pl.Float64).alias("ttfa_s"),
                                              pl.lit(None, dtype=pl.Float64).alias("reasoning_s"))
    extra = requests.filter(REASONED).select(
        "request_id", "reasoning_chunks", "num_chunks",
        ns_to_s(pl.col("first_answer_ns") - pl.col("scheduled_ns")).alias("ttfa_s"),
        ns_to_s(pl.col("first_answer_ns") - pl.col("first_token_ns")).alias("reasoning_s"))
    return ttft_rows.join(extra, on="request_id", how="inner")


def section(rows: pl.DataFrame, requests: pl.DataFrame, itl_reasoning: dict[str, float | int | None],
            itl_answer: dict[str, float | int | None], handoff: pl.DataFrame) -> dict[str, object] | None:
    """The summary's `reasoning` section (null when no request of the window reasoned). `rows` is
    `request_table`; the two ITL dicts are pooled stats of each phase's steady gaps; `handoff` the
    per-request crossing gaps (`handoff_rows`)."""
    if rows.height == 0:
        return None
    with_token = requests.filter(pl.col("first_token_ns").is_not_null()).height
    chunks = int(rows["num_chunks"].fill_null(0).sum())
    answered = rows.filter(pl.col("ttfa_s").is_not_null())
    by_bucket: dict[str, object] = dict(describe_by(answered, "ttfa_s", "bucket", TTFT_KEYS, BUCKET_LABELS))
    by_bucket["all"] = describe(answered, "ttfa_s", TTFT_KEYS)
    return {
        "requests": rows.height,
        "answered": answered.height,
        "request_share": rows.height / with_token if with_token else None,
        "chunk_share": int(rows["reasoning_chunks"].sum()) / chunks if chunks else None,
        "ttfa_s": by_bucket,
        "ttfa_by_class_s": describe_by(answered, "ttfa_s", "cls", TTFT_KEYS),
        "reasoning_s": describe(answered, "reasoning_s", TTFT_KEYS),
        "itl_reasoning_s": itl_reasoning,
        "itl_answer_s": itl_answer,
        "handoff_s": describe(handoff, "gap_s", TTFT_KEYS),
    }


def pooled_phase(phased: pl.DataFrame, phase: str) -> dict[str, float | int | None]:
    """In-memory pooled ITL of one phase's steady gaps (the out-of-core path: analysis/scale.py)."""
    return describe(phased.filter((pl.col("phase") == phase) & ~pl.col("injected")), "gap_s", ITL_KEYS)
