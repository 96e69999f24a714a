"""Time to first token and where it went.

TTFT = first token's arrival at the client − the request's *scheduled* send time, so a client
that sends late is charged, not hidden (open-loop coordinated omission). Decomposition:
  client_lag = sent − scheduled
  queue      = first engine step that prefilled the request (start) − sent   (engine steps only)
  prefill    = first token − that step's start                               (engine steps only)
  server     = first token − sent                                            (always; = queue + prefill)
Requests without a first token have no TTFT. Stats use `stats.PERCENTILE_METHOD`.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.buckets import BUCKET_LABELS, bucket_of, prompt_tokens
from itlbench.analysis.stats import describe, describe_by, ns_to_s

TTFT_KEYS: tuple[str, ...] = ("p50", "p90", "p99", "max", "mean", "count")
BREAKDOWN_PARTS: tuple[str, ...] = ("client_lag", "queue", "prefill", "server")


def first_prefill_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """server_request_id → start of the first step whose prefill_request_ids lists it."""
    return (
        steps.select("start_ns", pl.col("prefill_request_ids").alias("server_request_id"))
        .explode("server_request_id")
        .drop_nulls("server_request_id")
        .group_by("server_request_id")
        .agg(pl.col("start_ns").min().alias("first_step_ns"))
    )


def ttft_table(requests: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per request: bucket, class, TTFT and its parts in seconds (null where unknown)."""
    first = first_prefill_steps(steps)
    return (
        requests.join(first, on="server_request_id", how="left")
        .with_columns(
            bucket_of(prompt_tokens()).alias("bucket"),
            pl.col("injected").fill_null(False),
            ns_to_s(pl.col("first_token_ns") - pl.col("scheduled_ns")).alias("ttft_s"),
            ns_to_s(pl.col("sent_ns") - pl.col("scheduled_ns")).alias("client_lag_s"),
            ns_to_s(pl.col("first_step_ns") - pl.col("sent_ns")).alias("queue_s"),
            ns_to_s(pl.col("first_token_ns") - pl.col("first_step_ns")).alias("prefill_s"),
            ns_to_s(pl.col("first_token_ns") - pl.col("sent_ns")).alias("server_s"),
        )
        .select(
            "request_id",
            "server_request_id",
            "cls",
            "injected",
            "bucket",
            "status",
            "ttft_s",
            "client_lag_s",
            "queue_s",
            "prefill_s",
            "server_s",
        )
    )


def with_ttft(table: pl.DataFrame) -> pl.DataFrame:
    """Only the requests that received a first token."""
    return table.filter(pl.col("ttft_s").is_not_null())


def ttft_all(table: pl.DataFrame) -> dict[str, float | int | None]:
    return describe(with_ttft(table), "ttft_s", TTFT_KEYS)


def ttft_by_bucket(table: pl.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """Every bucket label present in the output, empty ones with count 0."""
    return describe_by(with_ttft(table), "ttft_s", "bucket", TTFT_KEYS, BUCKET_LABELS)


def ttft_by_class(table: pl.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """Per SLO class (`cls`: workload name or "injected")."""
    return describe_by(with_ttft(table), "ttft_s", "cls", TTFT_KEYS)


def breakdown_by_bucket(table: pl.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """Median of each TTFT part per bucket (<part>_p50), and the queue's p99 (queue_p99): a TTFT tail is
    usually queueing the median hides (15 ms median queue beside a 3 s TTFT p99 when the batch is full)."""
    done = with_ttft(table)
    out: dict[str, dict[str, float | int | None]] = {label: {} for label in BUCKET_LABELS}
    for part in BREAKDOWN_PARTS:
        stats = describe_by(done, f"{part}_s", "bucket", ("p50",), BUCKET_LABELS)
        for label in BUCKET_LABELS:
            out[label][f"{part}_p50"] = stats[label]["p50"]
    tail = describe_by(done, "queue_s", "bucket", ("p99",), BUCKET_LABELS)
    for label in BUCKET_LABELS:
        out[label]["queue_p99"] = tail[label]["p99"]
    return out
