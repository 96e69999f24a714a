"""Prompt-length buckets: a bounded label set for TTFT (TTFT grows with prompt length, so one
TTFT distribution over mixed lengths hides everything). k = 1024 tokens.

    le128: ≤128   le512: ≤512   le2k: ≤2048   le8k: ≤8192   le32k: ≤32768   gt32k: >32768
"""

from __future__ import annotations

import polars as pl

BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("le128", 128),
    ("le512", 512),
    ("le2k", 2048),
    ("le8k", 8192),
    ("le32k", 32768),
    ("gt32k", None),
)
BUCKET_LABELS: tuple[str, ...] = tuple(label for label, _ in BUCKETS)


def bucket_of(tokens: pl.Expr) -> pl.Expr:
    """Bucket label of a prompt-token-count expression (null stays null)."""
    expr = pl.when(tokens.is_null()).then(pl.lit(None, dtype=pl.Utf8))
    for label, bound in BUCKETS[:-1]:
        expr = expr.when(tokens <= bound).then(pl.lit(label))
    return expr.otherwise(pl.lit(BUCKETS[-1][0]))


def bucket_for(tokens: int) -> str:
    """Bucket label of one prompt length."""
    for label, bound in BUCKETS:
        if bound is None or tokens <= bound:
            return label
    raise AssertionError("unreachable")


def prompt_tokens() -> pl.Expr:
    """The prompt length used for bucketing: what the driver built, else what the server reported."""
    return pl.coalesce(pl.col("prompt_tokens"), pl.col("prompt_tokens_reported"))
