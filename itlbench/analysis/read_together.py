"""Chunks read together: did the server send them at once, or did the client read late?

Why: several content chunks of one stream returned by one read share the kernel stamp of the newest
bytes (itl.py, late_bound_ns), which validity.py used to hold against ITL whoever caused it. A server that
coalesces events (vLLM's API server may put several steps' tokens in one segment) delivered them together:
that is the ITL the user gets, not a measurement error. Only a client that got to the socket late bends
the figure. The stamps alone cannot tell the two apart; the other streams can:

For a read of k > 1 chunks of request R stamped t (returned at t_read), its first chunk would have
arrived, had the server sent it on time, with the step k−1 inferred steps before the read's own
(inferred_steps.py: every running stream advances each step), at a (no earlier than R's previous read).
  client  a client pause (loop or gc, the pause log) overlaps [a, t_read]; or no read of any other stream
          returned inside (a + hold, t − hold): the client served no socket while R's bytes were due
          (one epoll wake-up serves every readable socket, so a client that was reading would have read R);
          or the window is within the reader's own hold (load/clients/kernel.py HOLD_S: its deliberate
          batching of wake-ups, the client's doing however small)
  server  otherwise: the client was reading other sockets while R's socket had nothing to give
Each chunk of such a read gets `late_by` (client | server); a gap takes `client` when either of its chunks
has it, else `server` when either has that, else null.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from itlbench.analysis.inferred_steps import infer_steps

HOLD_NS = 1_000_000  # the kernel reader's wake-up hold (load/clients/kernel.py HOLD_S)


def classify_reads(chunks: pl.DataFrame, requests: pl.DataFrame, pauses: pl.DataFrame | None = None,
                   hold_ns: int = HOLD_NS) -> pl.DataFrame:
    """One row per shared read: request_id, t_ns, read_chunks, window_start_ns, late_by."""
    schema = {"request_id": pl.Utf8, "t_ns": pl.Int64, "read_chunks": pl.Int64, "window_start_ns": pl.Int64,
              "late_by": pl.Utf8}
    if chunks.is_empty() or "read_chunks" not in chunks.columns or "t_read_ns" not in chunks.columns:
        return pl.DataFrame(schema=schema)
    kernel = chunks.filter(pl.col("stamp") == "kernel")
    reads = (kernel.group_by("request_id", "t_ns").agg(pl.len().cast(pl.Int64).alias("read_chunks"),
                                                       pl.col("t_read_ns").max().alias("t_read_ns"))
             .sort("request_id", "t_ns")
             .with_columns(pl.col("t_read_ns").shift(1).over("request_id").alias("prev_read_ns")))
    shared = reads.filter(pl.col("read_chunks") > 1)
    if shared.is_empty():
        return pl.DataFrame(schema=schema)
    ends = np.sort(infer_steps(chunks, requests).steps["end_ns"].to_numpy())
    t = shared["t_ns"].to_numpy()
    k = shared["read_chunks"].to_numpy()
    own = np.searchsorted(ends, t, side="right") - 1
    back = own - (k - 1)
    prev = shared["prev_read_ns"].fill_null(0).to_numpy()
    step_time = ends[np.clip(back, 0, ends.size - 1)] if ends.size else prev
    a = np.maximum(np.where(back >= 0, step_time, prev), prev)
    awake = _others_read(reads, shared["request_id"].to_numpy(), a + hold_ns, t - hold_ns)
    paused = _paused(pauses, a, shared["t_read_ns"].to_numpy())
    short = (t - a) <= 2 * hold_ns
    late_by = np.where(paused | short | ~awake, "client", "server")
    return shared.select("request_id", "t_ns", "read_chunks").with_columns(
        pl.Series("window_start_ns", a, dtype=pl.Int64), pl.Series("late_by", late_by, dtype=pl.Utf8))


def _others_read(reads: pl.DataFrame, rids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window: did a read of another request return inside (lo, hi)? (all requests' read returns,
    minus this request's own inside the window)."""
    all_t = np.sort(reads["t_read_ns"].drop_nulls().to_numpy())
    total = np.searchsorted(all_t, hi, side="left") - np.searchsorted(all_t, lo, side="right")
    own_t = {r: np.sort(g["t_read_ns"].drop_nulls().to_numpy()) for (r,), g in reads.group_by("request_id")}
    mine = np.array([np.searchsorted(own_t[r], h, side="left") - np.searchsorted(own_t[r], low, side="right")
                     for r, low, h in zip(rids, lo, hi, strict=True)], dtype=np.int64)
    return (np.maximum(total, 0) - np.maximum(mine, 0)) > 0


def _paused(pauses: pl.DataFrame | None, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    if pauses is None or pauses.is_empty():
        return np.zeros(lo.size, dtype=bool)
    p = pauses.drop_nulls(["start_ns", "end_ns"]).sort("start_ns")
    starts, ends = p["start_ns"].to_numpy(), np.maximum.accumulate(p["end_ns"].to_numpy())
    # a pause overlaps [lo, hi] when it starts before hi and ends after lo (ends are running maxima)
    idx = np.searchsorted(starts, hi, side="left") - 1
    return (idx >= 0) & (ends[np.clip(idx, 0, None)] > lo)


def tag_gaps(gaps: pl.DataFrame, chunks: pl.DataFrame, requests: pl.DataFrame,
             pauses: pl.DataFrame | None = None) -> pl.DataFrame:
    """`gaps` (itl.gap_table rows) with `late_by`: who made a gap's shared-read stamp late (module docstring)."""
    reads = classify_reads(chunks, requests, pauses).select("request_id", "t_ns", "late_by")
    if gaps.is_empty() or reads.is_empty():
        return gaps.with_columns(pl.lit(None, dtype=pl.Utf8).alias("late_by"))
    out = (gaps.join(reads.rename({"late_by": "_b"}), on=["request_id", "t_ns"], how="left")
           .join(reads.rename({"t_ns": "t_prev_ns", "late_by": "_a"}), on=["request_id", "t_prev_ns"], how="left"))
    either = pl.concat_list(pl.col("_a"), pl.col("_b"))
    return out.with_columns(
        pl.when(either.list.contains("client")).then(pl.lit("client"))
        .when(either.list.contains("server")).then(pl.lit("server"))
        .otherwise(pl.lit(None, dtype=pl.Utf8)).alias("late_by")).drop("_a", "_b")
