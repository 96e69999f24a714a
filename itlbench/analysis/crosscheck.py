"""Cross-checks of the client's view against the server's own accounts.

- engine: the worst client gap against the longest engine step, and each injected request's
  client TTFT against the span of the engine steps that prefilled it. A client gap can only be
  longer than the step behind it (it also holds the neighbouring steps and the network); a client
  figure far above the engine's says the client or the transport added the delay.
- prompt_tokens: the prompt lengths the driver built against `usage.prompt_tokens` the server
  reported (text prompts for external servers are built to a token estimate).
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.stats import ns_to_s


def worst_gap_ns(chunks: pl.DataFrame) -> int | None:
    """The longest gap between consecutive chunks (index order) of one request."""
    gaps = (chunks.sort("request_id", "index")
            .select((pl.col("t_ns").diff().over("request_id")).alias("gap")).drop_nulls())
    return int(gaps["gap"].max()) if gaps.height else None  # type: ignore[arg-type]


def engine_check(requests: pl.DataFrame, chunks: pl.DataFrame | None, steps: pl.DataFrame,
                 worst_ns: int | None = None) -> dict[str, object]:
    """`worst_ns` stands in for the chunks (None: read off them) when a large run's chunks are not in memory."""
    if steps.is_empty():
        return {"source": "unavailable"}
    durations = steps.select(ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("d"))["d"]
    worst = worst_gap_ns(chunks) if chunks is not None else worst_ns
    worst_gap = float(worst) / 1e9 if worst is not None else None
    longest = float(durations.max()) if durations.len() else None
    return {
        "source": "engine_steps",
        "longest_step_s": longest,
        "worst_client_gap_s": worst_gap,
        "worst_gap_over_longest_step": (worst_gap / longest) if worst_gap and longest else None,
        "injected": _injected_prefill(requests, steps),
    }


def _injected_prefill(requests: pl.DataFrame, steps: pl.DataFrame) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    injected = requests.filter(pl.col("injected").fill_null(False) & pl.col("server_request_id").is_not_null())
    for row in injected.iter_rows(named=True):
        mine = steps.filter(pl.col("prefill_request_ids").list.contains(row["server_request_id"]))
        if mine.is_empty() or row["first_token_ns"] is None:
            continue
        span = (mine["end_ns"].max() - mine["start_ns"].min()) / 1e9  # type: ignore[operator]
        ttft = (row["first_token_ns"] - row["scheduled_ns"]) / 1e9
        out.append({"request_id": row["request_id"], "prompt_tokens": row["prompt_tokens"],
                    "prefill_steps": mine.height, "engine_prefill_span_s": span, "client_ttft_s": ttft,
                    "ttft_minus_engine_s": ttft - span})
    return out


def prompt_token_check(requests: pl.DataFrame) -> dict[str, object]:
    both = requests.drop_nulls(["prompt_tokens", "prompt_tokens_reported"])
    if both.is_empty():
        return {"checked": 0}
    diff = both.select((pl.col("prompt_tokens_reported") - pl.col("prompt_tokens")).alias("d"))["d"]
    ratio = both["prompt_tokens_reported"].sum() / max(1, both["prompt_tokens"].sum())
    return {"checked": both.height, "exact": int((diff == 0).sum()), "max_abs_diff": int(diff.abs().max()),
            "reported_over_planned": float(ratio)}


def output_token_check(requests: pl.DataFrame) -> dict[str, object]:
    """Tokens the client counted from chunks against `usage.completion_tokens`, over finished requests.
    A server may send a token without a chunk of its own (llama.cpp holds back a token whose bytes end
    mid-character and sends its text with the next one): `unseen` counts those, which the per-chunk
    figures (ITL, bundling) cannot see and the token totals then take from the server."""
    both = requests.filter(pl.col("status") == "ok").drop_nulls(["output_tokens", "output_tokens_reported"])
    if both.is_empty():
        return {"checked": 0}
    diff = both["output_tokens_reported"] - both["output_tokens"]
    reported = int(both["output_tokens_reported"].sum())
    unseen = int(diff.clip(lower_bound=0).sum())
    return {"checked": both.height, "exact": int((diff == 0).sum()), "counted": int(both["output_tokens"].sum()),
            "reported": reported, "unseen": unseen, "unseen_share": unseen / reported if reported else 0.0,
            "counted_over_reported": int((diff < 0).sum())}
