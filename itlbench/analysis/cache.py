"""Prompt tokens the server served from its prefix cache instead of prefilling them.

A cached prompt has a TTFT that says nothing about prefill, and with a seeded workload it is easy
to get one: the same command run twice against one long-lived server sends the same prompts, and
the second run finds them cached (a 4,000-token injected prompt measured 2.13 s, then 0.07 s, on
vLLM). Runs salt their prompts by default; this section shows what the server says it reused.

Per request: `usage.prompt_tokens_details.cached_tokens` where the server reports it (vLLM with
`--enable-prompt-tokens-details`, OpenAI, itlbench). Over the window: vLLM's own counters
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` (in tokens). An injected prompt
with more than `MOSTLY_CACHED` of its tokens cached gets a warning: its TTFT is not a prefill's.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.split import counter_increase
from itlbench.analysis.stats import json_safe
from itlbench.analysis.window import RunWindow

MOSTLY_CACHED = 0.5
VLLM_HITS = "vllm:prefix_cache_hits_total"
VLLM_QUERIES = "vllm:prefix_cache_queries_total"


def _fraction(cached: int | None, total: int | None) -> float | None:
    return None if cached is None or not total else cached / total


def _server_counters(server_metrics: pl.DataFrame, window: RunWindow) -> dict[str, object] | None:
    inc = counter_increase(server_metrics, window)
    if not inc.filter(pl.col("name").is_in([VLLM_HITS, VLLM_QUERIES])).height:
        return None
    hits = float(inc.filter(pl.col("name") == VLLM_HITS)["increase"].sum())
    queries = float(inc.filter(pl.col("name") == VLLM_QUERIES)["increase"].sum())
    return {"hit_tokens": hits, "query_tokens": queries, "hit_fraction": hits / queries if queries else None,
            "source": f"server_metrics:vllm ({VLLM_HITS}, {VLLM_QUERIES})"}


def cache_summary(requests: pl.DataFrame, server_metrics: pl.DataFrame, window: RunWindow) -> dict[str, object]:
    """cache.{requests_reporting, prompt_tokens, cached_tokens, cached_fraction, server, warnings,
    injected[].{request_id, prompt_tokens, cached_tokens, cached_fraction, ttft_s}}"""
    length = pl.coalesce("prompt_tokens_reported", "prompt_tokens")
    reporting = requests.filter(pl.col("cached_tokens_reported").is_not_null())
    prompt = int(reporting.select(length.sum()).item() or 0) if reporting.height else None
    cached = int(reporting["cached_tokens_reported"].sum()) if reporting.height else None
    injected = []
    for r in requests.filter(pl.col("injected").fill_null(False)).sort("scheduled_ns").iter_rows(named=True):
        tokens = r["prompt_tokens_reported"] or r["prompt_tokens"]
        c = r["cached_tokens_reported"]
        ttft = None if r["first_token_ns"] is None else (r["first_token_ns"] - r["scheduled_ns"]) / 1e9
        injected.append({"request_id": r["request_id"], "prompt_tokens": tokens, "cached_tokens": c,
                         "cached_fraction": _fraction(c, tokens), "ttft_s": ttft})
    warnings = [
        f"{i['request_id']}: {i['cached_tokens']:,} of its {i['prompt_tokens']:,} prompt tokens were served from "
        f"the server's prefix cache ({i['cached_fraction']:.0%}): its TTFT is not a prefill's (were the prompts "
        "reused from an earlier run with --reuse-prompts?)"
        for i in injected if (i["cached_fraction"] or 0) > MOSTLY_CACHED
    ]
    return json_safe({
        "requests_reporting": reporting.height,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_fraction": _fraction(cached, prompt),
        "injected": injected,
        "server": _server_counters(server_metrics, window),
        "mostly_cached_above": MOSTLY_CACHED,
        "warnings": warnings,
    })  # type: ignore[return-value]
