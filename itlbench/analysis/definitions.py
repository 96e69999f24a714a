"""The metric definitions every summary and report states, worded as in DESIGN.md."""

from __future__ import annotations

from itlbench.analysis.stats import PERCENTILE_METHOD

DEFINITIONS: dict[str, str] = {
    "ttft": (
        "TTFT: first generated token's arrival at the client − the request's scheduled send time. "
        "Decomposed: client lag (scheduled → actually sent), server queue (arrival → first scheduled step), "
        "prefill (first scheduled step → first token). A chunk carries tokens when its text/content or "
        "token_ids are non-empty; role-only and finish-only chunks carry none."
    ),
    "itl": (
        "ITL: every gap between consecutive content chunks of one stream. Reported three ways: pooled "
        "per-gap percentiles (p50/p90/p95/p99/p99.9/max; the default), per-request mean (TPOT = "
        "(last − first chunk) / (tokens − 1)), and per-token (a chunk carrying k tokens splits its gap into k). "
        "Token bundling is detected and warned about. Steady views exclude injected requests' own gaps."
    ),
    "reasoning": (
        "Reasoning streams: TTFA (time to first answer token) = the first chunk after the reasoning (content or "
        "a tool call) − the scheduled send time, beside TTFT, which counts the first reasoning token. "
        "A chunk that arrives before the request's first answer chunk is reasoning; a gap takes the phase of "
        "the chunk that closes it, so the gap into the answer is the answer phase's first (also shown alone). "
        "Phase ITL pools the steady gaps of requests that reasoned; the section appears only when one did."
    ),
    "stall": (
        "Stall: a gap ≥ max(stall_factor × the request's median gap, stall_floor). Reported: count, total "
        "stalled seconds (sum of the stalled gaps), worst gap, victim requests, and attribution: which "
        "in-flight prefill (injected or not) overlapped the gap, from the engine's step log when available. "
        "Stalls whose gaps overlap across streams form one event."
    ),
    "split": (
        "Prefill:decode split: engine time in prefill vs decode. Prefill-only and decode-only steps count "
        "whole; a mixed step is apportioned by a linear cost model of its token counts fitted on all the run's "
        "non-idle steps, pure and mixed (token share as a fallback, stated). For external engines their own counters (vLLM "
        "request prefill/decode time sums, SGLang gpu_execution_seconds_total{category}); source says which."
    ),
    "prompt_buckets": "Prompt buckets: ≤128, ≤512, ≤2k, ≤8k, ≤32k, >32k tokens (le128 … gt32k, k = 1024).",
    "goodput": (
        "Goodput: requests/s meeting every SLO of their class (TTFT by bucket, ITL p99 or max); a request "
        "must also have completed ok."
    ),
    "validity": (
        "Validity: the run records the client's own lag (send-schedule lag, event-loop lag, CPU) and flags "
        "itself invalid when the client, not the server, was the bottleneck, or when the path to the engine "
        "was disturbed (connections cut or silent; first tokens delivered late after the engine step that "
        "made them)."
    ),
    "window": (
        "Window: TTFT, goodput and request counts cover requests scheduled in [measure start, end) "
        "after warmup; ITL gaps, stalls and output-token throughput cover chunks that arrived in the "
        "window, whichever request they belong to; engine steps overlapping the window; rates divide "
        "by the window's seconds."
    ),
    "percentiles": f"Percentiles: {PERCENTILE_METHOD}.",
}
