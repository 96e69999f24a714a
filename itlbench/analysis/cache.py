"""Prompt tokens the server served from its prefix cache instead of prefilling them.

A cached prompt has a TTFT that says nothing about prefill, and with a seeded workload it is easy
to get one: the same command run twice against one long-lived server sends the same prompts, and
the second run finds them cached (a 4,000-token injected prompt measured 2.13 s, then 0.07 s, on
vLLM). Runs salt their prompts by default; this section shows what the server says it reused.

Per request: `usage.prompt_tokens_details.cached_tokens` where the server reports it (vLLM with
`--enable-prompt-tokens-details`, OpenAI, itlbench). Over the window: vLLM's own counters
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` (in tokens). An injected prompt
with more than `MOSTLY_CACHED` of its tokens cached gets a warning: its TTFT is not a prefill's.

Preemptions (the step log's `num_preemptions` in the window, else vLLM's `vllm:num_preemptions_total`):
a preempted request is prefilled again when it resumes and reads its own blocks back from the prefix
cache, so cached tokens count those re-reads too, even when every prompt is unique; they are named
beside the cache figures.
"""

from __future__ import annotations

import polars as pl

from itlbench.analysis.split import counter_increase
from itlbench.analysis.stats import json_safe
from itlbench.analysis.window import RunWindow

MOSTLY_CACHED = 0.5
VLLM_HITS = "vllm:prefix_cache_hits_total"
VLLM_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"


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


def preemptions(steps: pl.DataFrame | None, server_metrics: pl.DataFrame, window: RunWindow) -> int | None:
    """The engine's preemptions in the window: from its step log, else vLLM's counter; None if unknown."""
    if steps is not None and steps.height and "num_preemptions" in steps.columns:
        return int(steps["num_preemptions"].fill_null(0).sum())
    inc = counter_increase(server_metrics, window).filter(pl.col("name") == VLLM_PREEMPTIONS)
    return int(inc["increase"].sum()) if inc.height else None


def _preemption_warning(count: int | None, cached: int | None) -> list[str]:
    if not count or not cached:
        return []
    return [f"{count:,} preemptions in the window: a preempted request's re-prefill reads its own blocks back "
            "from the prefix cache, so the cached tokens include those re-reads, not only prefixes shared "
            "between prompts"]


def cache_summary(requests: pl.DataFrame, server_metrics: pl.DataFrame, window: RunWindow,
                  steps: pl.DataFrame | None = None, all_steps: pl.DataFrame | None = None) -> dict[str, object]:
    """cache.{requests_reporting, prompt_tokens, cached_tokens, cached_fraction, server, warnings, preemptions,
    injected[].{request_id, prompt_tokens, cached_tokens, cached_fraction, ttft_s}}; `steps` (the window's)
    give the preemptions whose re-prefills the cache served (`preemptions_run`: the whole run's, from
    `all_steps`: a window request may be preempted during the drain)."""
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
    preempted = preemptions(steps, server_metrics, window)
    server = _server_counters(server_metrics, window)
    warnings += _preemption_warning(preempted, cached or int((server or {}).get("hit_tokens") or 0))
    return json_safe({
        "requests_reporting": reporting.height,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_fraction": _fraction(cached, prompt),
        "injected": injected,
        "server": server,
        "preemptions": preempted,
        "preemptions_run": int(all_steps["num_preemptions"].fill_null(0).sum())
        if all_steps is not None and all_steps.height and "num_preemptions" in all_steps.columns else None,
        "mostly_cached_above": MOSTLY_CACHED,
        "warnings": warnings,
    })  # type: ignore[return-value]
