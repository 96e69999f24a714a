"""What held the requests that waited for the engine, in one sentence (report, brief and capacity answer).

From a step log, each limit's share of the waiting time; from an external server's /metrics
(analysis/queueing_metrics.py), what the server said: its queue-time histogram, preemptions, and at the
periodic reads how many ran while requests waited.
"""

from __future__ import annotations

from typing import Any

from itlbench.report.durations import fmt_s

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
    if q.get("source") == "server_metrics":
        return metrics_sentence(q)
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


def _bound(seconds: float) -> str:
    """A histogram's bucket edge as the server wrote it: 5 s, 0.5 s, 7680 s."""
    return f"{seconds:g} s"


# below this share of the window's requests, the histogram's mean misses the longest waits (those still queued
# or streaming when the window closed are observed only when they finish, after the last read)
COVERED_SHARE = 0.5


def _queue_part(h: dict[str, Any], window_requests: int | None = None) -> str:
    if not h.get("count"):
        return "none counted by its queue-time histogram between the window's reads"
    covered = ""
    if window_requests and h["count"] < COVERED_SHARE * window_requests:
        covered = (f", but only over the {h['count']:,} requests that finished between its reads, of "
                   f"{window_requests:,} sent in the window: the longest waits ended after the last read, so a longer "
                   "--duration counts them")
    if h.get("p99_le") is not None:
        tail = f"p99 ≤ {_bound(h['p99_le'])} by its histogram"
    elif h.get("p99_above") is not None:
        tail = f"p99 above {_bound(h['p99_above'])}, its histogram's last bound"
    elif h.get("max_le") is not None:
        tail = f"all {h['count']:,} ≤ {_bound(h['max_le'])} by its histogram"
    else:
        tail = f"{h['count']:,} requests"
    return f"waited {fmt_s(h.get('mean_s'))} on average ({tail}){covered}"


def _held_part(p: dict[str, Any], cap: Any) -> str:
    reads, waiting = p.get("reads") or 0, p.get("waiting_reads") or 0
    if not waiting:
        return f"waiting at none of its {reads:,} periodic reads"
    out = f"waiting at {'all' if waiting == reads else f'{waiting:,} of'} {reads:,} periodic reads"
    held, mode, most = p.get("running_held"), p.get("running_mode"), p.get("running_max")
    if held is not None:
        at = p.get("running_mode_reads") or 0
        notes = ([f"max_num_seqs {cap}"] if cap is not None and held == cap else []) + (
            [] if at == waiting else [f"at {at:,} of them, never above"])
        then = [f"running held at {held}" + (f" ({'; '.join(notes)})" if notes else "")]
    else:
        low, high = p.get("running_range") or (mode, mode)
        spread = f"{low}–{high}" if low != high else f"{mode}"
        at = p.get("running_mode_reads") or 0
        if mode is None:
            then = []
        elif low == high and at == waiting and most == mode:  # one count at every read: nothing more to say
            then = [f"{mode} ran"]
        else:
            then = [f"{spread} ran ({mode} at {at:,} of them; at most {most} at any read)"]
    kv = p.get("kv_usage_waiting")
    then += [f"K/V was {kv:.0%} used"] if kv is not None else []
    return out + (f", while {' and '.join(then)}" if then else "")


def metrics_sentence(q: dict[str, Any]) -> str:
    """"Requests in vLLM's queue, by its /metrics: waited 2.10 s on average (p99 ≤ 5 s by its histogram); waiting
    at 9 of 10 periodic reads, while running held at 64 and K/V was 41% used; 12 preemptions." Without periodic
    reads it says --scrape-interval would show what held the queue. It opens with "Requests" as the step log's
    sentence does (the capacity answer goes on from "At 4.75 requests/s, r…")."""
    parts = [_queue_part(q["queue_time_s"], q.get("window_requests"))] if q.get("queue_time_s") else []
    periodic = q.get("periodic")
    if periodic:
        parts.append(_held_part(periodic, q.get("max_num_seqs")))
    if q.get("preemptions") is not None:
        n = q["preemptions"]
        word = "retraction" if q.get("engine") == "sglang" else "preemption"
        parts.append(f"{n:,} {word}{'' if n == 1 else 's'}")
    if not periodic:
        parts.append("--scrape-interval 5s would show what held the queue (running and waiting requests at each "
                     "read)")
    return f"Requests in {q.get('label') or 'the server'}'s queue, by its /metrics: " + "; ".join(parts) + "."
