"""Inter-token latency: every gap between consecutive content chunks of one request's stream.

Views (percentiles per `stats.PERCENTILE_METHOD`):
  pooled     every gap is one sample (the default and the headline; the tail is not smeared)
  per_token  a chunk carrying k tokens splits the gap before it into k equal gaps of gap/k
  tpot       per request: (last chunk − first chunk) / (tokens − 1), tokens = Σ n_tokens;
             requests with fewer than 2 tokens have none
The first chunk of a stream opens no gap (its arrival is TTFT). "Steady" views drop gaps of
injected requests; "all" views keep them.

Each gap also says how its two stamps were taken (`stamp`: "kernel" when both chunks carry kernel
receive stamps, else "user") and, for kernel stamps, `late_bound_ns`: how much later than its bytes'
arrival either stamp can be. A kernel stamp is that of the newest bytes its read returned, so it is
exact for the last chunk of a read and an upper bound for the chunks before it in the same read
(`read_chunks` > 1): those arrived no earlier than the previous read returned (the previous chunk's
`t_read_ns`, or the request's send for a first chunk).
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import describe, ns_to_s

ITL_KEYS: tuple[str, ...] = ("p50", "p90", "p95", "p99", "p999", "max", "mean", "count")
TPOT_KEYS: tuple[str, ...] = ("p50", "p90", "p99", "mean", "count")
BUNDLING_WARN_FRACTION = 0.05
TOGETHER_WARN_FRACTION = 0.5  # most gaps 0: the tokens came in together, there is no ITL to measure


_STAMP_COLUMNS = {"stamp": pl.Utf8, "t_read_ns": pl.Int64, "read_chunks": pl.Int64}


def _tagged_chunks(chunks: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    tags = requests.select("request_id", "cls", pl.col("injected").fill_null(False))
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in _STAMP_COLUMNS.items() if c not in chunks.columns]
    return (
        chunks.with_columns(missing).join(tags, on="request_id", how="left")
        .with_columns(
            pl.col("injected").fill_null(False),
            pl.col("n_tokens").fill_null(1).clip(lower_bound=1),
        )
        .sort("request_id", "index", "t_ns")
    )


def _late_bound(requests: pl.DataFrame) -> pl.Expr:
    """Per chunk: 0 for an exact kernel stamp, the bound for one shared with later bytes, null for user."""
    prev_read = pl.col("t_read_ns").shift(1).over("request_id")
    if "sent_ns" in requests.columns:
        prev_read = prev_read.fill_null(pl.col("sent_ns"))
    last_of_read = pl.col("t_ns") != pl.col("t_ns").shift(-1).over("request_id")
    return (
        pl.when(pl.col("stamp") != "kernel").then(pl.lit(None, dtype=pl.Int64))
        .when(last_of_read.fill_null(True) | (pl.col("read_chunks").fill_null(1) <= 1)).then(pl.lit(0))
        .otherwise((pl.col("t_ns") - prev_read).clip(lower_bound=0).fill_null(0))
    )


def gap_table(chunks: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """One row per gap: request_id, cls, injected, t_prev_ns, t_ns, gap_s, n_tokens (of the later chunk),
    stamp (kernel | user) and late_bound_ns (kernel stamps: how late either stamp can be; user: null)."""
    sent = requests.select("request_id", "sent_ns") if "sent_ns" in requests.columns else None
    tagged = _tagged_chunks(chunks, requests)
    if sent is not None:
        tagged = tagged.join(sent, on="request_id", how="left")
    kernel = (pl.col("stamp") == "kernel").fill_null(False)
    return (
        tagged.with_columns(_late_bound(requests if sent is not None else pl.DataFrame()).alias("late_ns"),
                            kernel.alias("kernel"))
        .with_columns(pl.col("t_ns").shift(1).over("request_id").alias("t_prev_ns"),
                      pl.col("late_ns").shift(1).over("request_id").alias("prev_late_ns"),
                      pl.col("kernel").shift(1).over("request_id").alias("prev_kernel"))
        .drop_nulls("t_prev_ns")
        .with_columns(ns_to_s(pl.col("t_ns") - pl.col("t_prev_ns")).alias("gap_s"),
                      pl.when(pl.col("kernel") & pl.col("prev_kernel")).then(pl.lit("kernel"))
                      .otherwise(pl.lit("user")).alias("stamp"))
        .with_columns(pl.when(pl.col("stamp") == "kernel")
                      .then(pl.max_horizontal("late_ns", "prev_late_ns"))
                      .otherwise(pl.lit(None, dtype=pl.Int64)).alias("late_bound_ns"))
        .select("request_id", "cls", "injected", "t_prev_ns", "t_ns", "gap_s", "n_tokens", "stamp",
                "late_bound_ns")
    )


def steady(gaps: pl.DataFrame) -> pl.DataFrame:
    """Gaps of non-injected requests: what the injection did to everyone else."""
    return gaps.filter(~pl.col("injected"))


def pooled(gaps: pl.DataFrame) -> dict[str, float | int | None]:
    return describe(gaps, "gap_s", ITL_KEYS)


def per_token(gaps: pl.DataFrame) -> dict[str, float | int | None]:
    split = (
        gaps.select(
            (pl.col("gap_s") / pl.col("n_tokens")).alias("gap_s"),
            pl.int_ranges(0, pl.col("n_tokens")).alias("k"),
        )
        .explode("k")
        .select("gap_s")
    )
    return describe(split, "gap_s", ITL_KEYS)


def tpot_table(chunks: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """One row per request with ≥ 2 tokens: request_id, cls, injected, tokens, tpot_s."""
    return (
        _tagged_chunks(chunks, requests)
        .group_by("request_id")
        .agg(
            pl.col("cls").first(),
            pl.col("injected").first(),
            pl.col("n_tokens").sum().alias("tokens"),
            (pl.col("t_ns").max() - pl.col("t_ns").min()).alias("span_ns"),
        )
        .filter(pl.col("tokens") >= 2)
        .with_columns((ns_to_s(pl.col("span_ns")) / (pl.col("tokens") - 1)).alias("tpot_s"))
        .drop("span_ns")
        .sort("request_id")
    )


def tpot(table: pl.DataFrame) -> dict[str, float | int | None]:
    return describe(table, "tpot_s", TPOT_KEYS)


def bundling(chunks: pl.DataFrame, warn_fraction: float = BUNDLING_WARN_FRACTION) -> dict[str, object]:
    """How often the server put more than one token in a chunk. Bundled tokens arrive together,
    so pooled gaps undercount tokens and per-token gaps are an even split, not a measurement."""
    n = chunks.height
    bundled = chunks.filter(pl.col("n_tokens") > 1).height if n else 0
    tokens = int(chunks["n_tokens"].fill_null(1).sum()) if n else 0
    return bundling_of(n, bundled, tokens, warn_fraction)


def bundling_of(n: int, bundled: int, tokens: int, warn_fraction: float = BUNDLING_WARN_FRACTION) -> dict[str, object]:
    """`bundling` from its counts: chunks, chunks with more than one token, tokens."""
    fraction = bundled / n if n else 0.0
    warning = None
    if fraction > warn_fraction:
        warning = (
            f"{fraction:.1%} of content chunks carry more than one token (server bundles tokens): "
            "pooled ITL counts chunks, not tokens; see itl_per_token_s"
        )
    return {
        "fraction": fraction,
        "chunks": n,
        "bundled_chunks": bundled,
        "tokens_per_chunk": tokens / n if n else None,
        "warn_fraction": warn_fraction,
        "warning": warning,
    }


def open_gap_table(chunks: pl.DataFrame, requests: pl.DataFrame, lo_ns: int, hi_ns: int) -> pl.DataFrame:
    """The gaps no token closed inside [lo_ns, hi_ns): per request, from its last chunk before hi_ns to
    hi_ns (its next chunk came later, or never) or to the moment it was cut (cancelled, timed out,
    failed: `done_ns`), whichever came first. A stream that froze is a stall by the definition, yet
    `gap_table` holds only gaps a later chunk closed, so without these it would count nowhere.
    Columns as `gap_table` plus `open` (True) and `censored` (still waiting at hi_ns: a lower bound).
    A request that finished ok closed its stream and has none."""
    tagged = _tagged_chunks(chunks, requests)
    last = tagged.filter(pl.col("t_ns") < hi_ns).group_by("request_id", maintain_order=True).last()
    later = tagged.filter(pl.col("t_ns") >= hi_ns).select("request_id").unique()
    status = requests.select("request_id", "status", "done_ns")
    cut = pl.min_horizontal(pl.col("done_ns").fill_null(hi_ns), pl.lit(hi_ns))
    end = (pl.when(pl.col("_later")).then(pl.lit(hi_ns))
           .when(pl.col("status") == "ok").then(pl.lit(None, dtype=pl.Int64))
           .otherwise(cut))
    return (
        last.join(later.with_columns(pl.lit(True).alias("_later")), on="request_id", how="left")
        .join(status, on="request_id", how="left")
        .with_columns(pl.col("_later").fill_null(False), pl.col("t_ns").alias("t_prev_ns"))
        .with_columns(end.cast(pl.Int64).alias("t_ns"))
        .filter(pl.col("t_ns").is_not_null() & (pl.col("t_ns") > lo_ns) & (pl.col("t_ns") > pl.col("t_prev_ns")))
        .select("request_id", "cls", "injected", "t_prev_ns", "t_ns",
                ns_to_s(pl.col("t_ns") - pl.col("t_prev_ns")).alias("gap_s"),
                pl.lit(1, dtype=pl.Int64).alias("n_tokens"),
                pl.when(pl.col("stamp") == "kernel").then(pl.lit("kernel")).otherwise(pl.lit("user")).alias("stamp"),
                pl.when(pl.col("stamp") == "kernel").then(pl.lit(0, dtype=pl.Int64)).alias("late_bound_ns"),
                pl.lit(True).alias("open"), (pl.col("t_ns") >= hi_ns).alias("censored"))
    )


def with_open(gaps: pl.DataFrame, opened: pl.DataFrame) -> pl.DataFrame:
    """The closed gaps (`open` False) and the open ones, one frame for find_stalls."""
    closed = gaps.with_columns(pl.lit(False).alias("open"), pl.lit(False).alias("censored"))
    return pl.concat([closed, opened], how="diagonal_relaxed") if opened.height else closed


def arrived_together(gaps: pl.DataFrame, warn_fraction: float = TOGETHER_WARN_FRACTION) -> dict[str, object]:
    """How many of the steady gaps are 0: chunks delivered in one read with the one before them. A proxy
    that buffers the stream (or a server that sends the response whole) gives ITL p50..max of 0 ms, which
    is no measurement; `bundling` does not see it (one token per chunk) and the shared-read check calls
    it the server's delivery, so this names it."""
    zero = int((gaps["gap_s"] <= 0).sum()) if gaps.height else 0
    return arrived_together_of(gaps.height, zero, warn_fraction)


def arrived_together_of(n: int, zero: int, warn_fraction: float = TOGETHER_WARN_FRACTION) -> dict[str, object]:
    """`arrived_together` from its counts: steady gaps, and those of 0 s."""
    fraction = zero / n if n else 0.0
    warning = None
    if n and fraction > warn_fraction:
        warning = (f"tokens arrived together ({fraction:.0%} of {n:,} gaps are 0): a proxy may be buffering the "
                   "stream, or the server sent whole responses; ITL is not measurable")
    return {"gaps": n, "zero_gaps": zero, "fraction": fraction, "warn_fraction": warn_fraction, "warning": warning}


def worst_not_client(gaps: pl.DataFrame, stalls: pl.DataFrame) -> float | None:
    """The longest a steady stream waited that the client's own pause did not make (`itl_s.max_not_client`):
    the longest of `gaps` (steady, closed) and of the streams frozen when the window closed, leaving out the
    stalls the stall analysis blamed on the client (`cause` client). Ranking runs by `itl_s.max` named the
    setting whose client paused least (a 333 ms pause outranked an ITL p99 of 11 ms against 43 ms); a real
    prefill freeze is the server's and still counts. Gaps below the stall rule carry no cause and count."""
    blamed = (pl.col("cause") == "client").fill_null(False) if "cause" in stalls.columns else pl.lit(False)
    frozen = pl.col("open").fill_null(False) if "open" in stalls.columns else pl.lit(False)
    client = stalls.filter(blamed)
    keys = ["request_id", "t_prev_ns", "t_ns"]
    kept = gaps.join(client.select(keys), on=keys, how="anti") if client.height else gaps
    frozen_rows = stalls.filter(frozen & ~blamed) if stalls.width else stalls
    values = [float(f["gap_s"].max()) for f in (kept, frozen_rows) if f.height]  # type: ignore[arg-type]
    return max(values) if values else None
