"""An event's cause when its own is not one the source can vouch for: one rule for every attribution source.

Why one rule: the client-only attribution (inferred steps) and the one on vLLM's spans both leave some
stalls `unknown`, but they sort those into different numbers of reasons (`silent`, `late_read`,
`no_steps` against `no_steps` alone). When an event's cause was taken from the (cause, reason) group
with the most stalled seconds, the finer source split its unexplained seconds into small groups and a
minority cause (`client`, say) won, while the coarser one kept them together and `unknown` won: the same
stalls, two answers, decided by how the sources name their ignorance.

The rule: an event whose own cause is `prefill`, `scrape` or `client` (what the client's records and the
prefill windows vouch for) keeps it. Any other event takes the *cause* that carries most of its stalled
seconds, summed over every reason; a reason only says why, so it is chosen afterwards, as the one with
most seconds among that cause's stalls. So an event mostly unexplained is `unknown` whichever source
looks at it: a known cause is claimed only where it carries the larger share. Ties go to the cause (then
reason) that sorts first, so the answer does not depend on row order.
"""

from __future__ import annotations

import polars as pl

KEPT = ("prefill", "scrape", "client")


def _top(frame: pl.DataFrame, keys: list[str], by: str) -> pl.DataFrame:
    """Per `keys`, the row with the most seconds (ties: the smallest `by`)."""
    return (frame.sort([*keys, "_s", by], descending=[False] * len(keys) + [True, False], nulls_last=True)
            .unique(keys, keep="first", maintain_order=True))


def event_causes(events: pl.DataFrame, stalls: pl.DataFrame) -> pl.DataFrame:
    """`events` with `cause` and `unknown_reason` set by the module's rule from the stalls' (which carry
    `event`, `cause`, `unknown_reason`, `gap_s`)."""
    if events.is_empty():
        return events.with_columns(pl.lit(None, dtype=pl.Utf8).alias("unknown_reason"))
    by_cause = stalls.group_by("event", "cause").agg(pl.col("gap_s").sum().alias("_s"))
    cause = _top(by_cause, ["event"], "cause").select("event", pl.col("cause").alias("_cause"))
    by_reason = (stalls.join(cause, left_on=["event", "cause"], right_on=["event", "_cause"], how="semi")
                 .group_by("event", "unknown_reason").agg(pl.col("gap_s").sum().alias("_s")))
    reason = _top(by_reason, ["event"], "unknown_reason").select("event", pl.col("unknown_reason").alias("_reason"))
    kept = pl.col("cause").is_in(KEPT).fill_null(False)
    return (events.join(cause, on="event", how="left").join(reason, on="event", how="left")
            .with_columns(pl.when(kept).then(pl.col("cause")).otherwise(pl.col("_cause")).alias("cause"),
                          pl.when(kept).then(pl.lit(None, dtype=pl.Utf8)).otherwise(pl.col("_reason"))
                          .alias("unknown_reason"))
            .drop("_cause", "_reason"))
