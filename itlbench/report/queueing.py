"""What held the requests that waited for the engine, in one sentence (report, brief and capacity answer)."""

from __future__ import annotations

from typing import Any

from itlbench.report.style import fmt_s

# each limit as the sentence names it, with the setting that moves it
_LIMIT_TEXT = {
    "max_num_seqs": "the running batch was full (max_num_seqs {cap})",
    "kv_cache": "K/V memory was full (preemptions, or blocks all in use)",
    "token_budget": "each step's token budget was spent (by prefill chunks or decodes)",
    "other": "they had arrived during a step (or the policy's order kept them)",
}


def _limit(name: str, cap: Any) -> str:
    return _LIMIT_TEXT[name].format(cap=cap if cap is not None else "?")


def queueing_sentence(summary: dict[str, Any]) -> str | None:
    """'Requests waited for the engine in 17% of the window (queue p99 3.03 s): the running batch was full
    (max_num_seqs 64) 100% of that time.' None without a step log, or where no step left a request waiting."""
    q = summary.get("queueing") or {}
    waiting = q.get("waiting_s") or 0.0
    if not waiting or not q.get("by_limit_s"):
        return None
    shares = sorted(((s / waiting, name) for name, s in q["by_limit_s"].items() if s), reverse=True)
    first_share, first = shares[0]
    rest = "; ".join(f"{_limit(name, q.get('max_num_seqs'))} {share:.0%}" for share, name in shares[1:])
    share = q.get("waiting_share")
    where = f" in {share:.0%} of the window" if share is not None else f" {fmt_s(waiting)}"
    p99 = (q.get("queue_s") or {}).get("p99")
    tail = f" (queue p99 {fmt_s(p99)})" if p99 is not None else ""
    return (f"Requests waited for the engine{where}{tail}: {_limit(first, q.get('max_num_seqs'))} "
            f"{first_share:.0%} of that time" + (f"; {rest}." if rest else "."))
