"""The run report's tables: events, TTFT by bucket, ITL views, the run in numbers, reasoning, and the SLOs missed,
each marking what the run's validity verdict withdrew."""

from __future__ import annotations

from typing import Any

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.analysis.gpu import gpu_line
from itlbench.report.data import RunData
from itlbench.report.document import Section, Table
from itlbench.report.durations import counted
from itlbench.report.engines import engine_check_line
from itlbench.report.slos import slo_text
from itlbench.report.style import fmt_s, fmt_tokens
from itlbench.report.withdrawn import Withdrawn


def open_note(stalls: dict[str, Any]) -> str:
    """The stalls no token closed: the stream stopped (see stalls.open)."""
    opened = stalls.get("open") or {}
    if not opened.get("count"):
        return ""
    return (f"; {opened['count']} open, {opened.get('at_window_end', 0)} of them still stalled when the window "
            "closed (counted to its end)")


def _num(v: Any, fmt: str = "{:,.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def send_lag(figures: dict[str, Any]) -> str:
    """The send lag's p99, or its largest where too few requests support a p99 (a short run)."""
    if figures.get("send_lag_p99_s") is not None or figures.get("send_lag_max_s") is None:
        return f"send lag p99 {fmt_s(figures.get('send_lag_p99_s'))}"
    return (f"send lag at most {fmt_s(figures['send_lag_max_s'])} over {figures.get('requests_with_send_lag', 0)} "
            "requests, too few for a p99")


def loop_lag(figures: dict[str, Any]) -> str:
    """The event-loop lag at the quantile the validity check judged it by (`loop_lag_stat`: p99, or p90 where a
    short run's samples support no p99), so a valid short run does not read "p99 —" while its summary has a p90."""
    stat = figures.get("loop_lag_stat")
    if stat and figures.get("loop_lag_s") is not None:
        return f"event-loop lag {stat} {fmt_s(figures['loop_lag_s'])}"
    return f"event-loop lag p99 {fmt_s(figures.get('loop_lag_p99_s'))}"


EVENT_ROWS = 8


def events_table(data: RunData) -> Table | None:
    """The stall events, most stream-seconds first; a row's victims are requests (summary `victims`, as the
    terminal and docs/measures.md count them), and the caption says how many events the rows leave out."""
    stalls = data.summary.get("stalls") or {}
    events = stalls.get("attribution") or []
    if not events:
        return None
    rows = []
    for ev in events[:EVENT_ROWS]:
        injected = list(ev.get("injected_request_ids") or [])
        others = [r for r in ev.get("prefill_request_ids") or [] if r not in injected]
        who = ", ".join([f"{r} (injected)" for r in injected[:2]] + others[:2])
        more = len(injected) + len(others) - min(2, len(injected)) - min(2, len(others))
        rows.append([fmt_s(ev.get("start_s", 0)), str(ev.get("victims")), str(ev.get("stalls")),
                     fmt_s(ev.get("worst_s")), fmt_s(ev.get("stalled_s")), str(ev.get("cause") or "unknown"),
                     (who + (f" +{more}" if more > 0 else "")) or "—",
                     fmt_tokens(ev.get("prefill_tokens")) if ev.get("prefill_tokens") else "—",
                     fmt_s(ev.get("longest_step_s"))])
    total = max(int(stalls.get("events") or 0), len(events))
    shown = f" ({len(rows)} of {total:,})" if total > len(rows) else ""
    return Table(["start", "requests", "stalls", "worst gap", "stalled", "cause", "prefilling", "prefill tokens",
                  "longest step"], rows, "Stall events (stalls overlapping across streams), the most stream-seconds "
                 f"stalled first{shown}",
                 align_right_from=1, withdrawn=Withdrawn.of(data.summary).why("stalls") or "")


def ttft_table(data: RunData) -> Table:
    s = data.summary
    gone = Withdrawn.of(s)
    ttft, parts = s.get("ttft_s") or {}, s.get("ttft_breakdown_s") or {}
    rows, invalid = [], set()
    for b in (*BUCKET_LABELS, "all"):
        d = ttft.get(b) or {}
        if not d.get("count"):
            continue
        p = parts.get(b) or {}
        key = "ttft_s" if b == "all" else f"ttft_s.{b}"
        if gone.why(key):
            invalid.add(len(rows))
        rows.append([gone.label(key, b), str(d["count"]), fmt_s(d.get("p50")), fmt_s(d.get("p90")),
                     fmt_s(d.get("p99")), fmt_s(d.get("max")), fmt_s(p.get("client_lag_p50")),
                     fmt_s(p.get("queue_p50")), fmt_s(p.get("queue_p99")), fmt_s(p.get("prefill_p50"))])
    return Table(["bucket", "requests", "p50", "p90", "p99", "max", "client lag p50", "queue p50", "queue p99",
                  "prefill p50"],
                 rows, "TTFT by prompt bucket", withdrawn=gone.why("ttft_s") or "", invalid_rows=frozenset(invalid))


ITL_VIEWS = (("itl_s", "pooled gaps, steady streams"), ("itl_all_s", "pooled gaps, all streams"),
             ("itl_per_token_s", "per token, steady streams"), ("tpot_s", "per request mean (TPOT)"))


def itl_table(data: RunData) -> Table:
    s = data.summary
    gone = Withdrawn.of(s)
    rows, invalid = [], set()
    for key, name in ITL_VIEWS:
        d = s.get(key) or {}
        if gone.why(key):
            invalid.add(len(rows))
        rows.append([gone.label(key, name), f"{d.get('count') or 0:,}", fmt_s(d.get("p50")), fmt_s(d.get("p90")),
                     fmt_s(d.get("p99")), fmt_s(d.get("p999")), fmt_s(d.get("max"))])
    return Table(["view", "samples", "p50", "p90", "p99", "p99.9", "max"], rows,
                 "Inter-token latency (samples: gaps, or for TPOT the steady requests sent in the window with two "
                 "tokens or more)", withdrawn=gone.any_of(*(k for k, _ in ITL_VIEWS)) or "",
                 invalid_rows=frozenset(invalid))


def reasoning_section(data: RunData) -> Section | None:
    """TTFT to the first answer token and each phase's ITL, for runs where some request reasoned."""
    r = data.summary.get("reasoning")
    if not r:
        return None
    share, chunk = r.get("request_share"), r.get("chunk_share")
    lead = (f"{r.get('requests', 0)} requests streamed reasoning before their answer"
            + (f" ({share:.0%} of the requests with a first token)" if share is not None else "")
            + (f"; {chunk:.0%} of their chunks were reasoning" if chunk is not None else "")
            + f"; {r.get('answered', 0)} reached an answer. TTFT above counts the first reasoning token; "
            "TTFA counts the first answer token. The gap into the answer is counted in the answer phase.")
    ttfa = r.get("ttfa_s") or {}
    rows = []
    for b in (*BUCKET_LABELS, "all"):
        d = ttfa.get(b) or {}
        if d.get("count"):
            rows.append([b, str(d["count"]), fmt_s(d.get("p50")), fmt_s(d.get("p90")), fmt_s(d.get("p99")),
                         fmt_s(d.get("max"))])
    gone = Withdrawn.of(data.summary)
    by_bucket = Table(["bucket", "requests", "p50", "p90", "p99", "max"], rows,
                      "Time to first answer token (TTFA) by prompt bucket", withdrawn=gone.why("ttft_s") or "")
    phases = []
    for key, name in (("reasoning_s", "reasoning time (first token → first answer)"),
                      ("itl_reasoning_s", "ITL, reasoning phase"), ("itl_answer_s", "ITL, answer phase"),
                      ("handoff_s", "gap into the answer (one per request)")):
        d = r.get(key) or {}
        phases.append([name, f"{d.get('count') or 0:,}", fmt_s(d.get("p50")), fmt_s(d.get("p90")),
                       fmt_s(d.get("p99")), fmt_s(d.get("max"))])
    by_phase = Table(["figure", "samples", "p50", "p90", "p99", "max"], phases, "Reasoning and answer phases",
                     withdrawn=gone.any_of("ttft_s", "itl_s") or "")
    return Section("Reasoning and answer").add(lead, by_bucket, by_phase)


def totals_table(data: RunData) -> Table:
    s = data.summary
    gone = Withdrawn.of(s)
    thr, good, req = s.get("throughput") or {}, s.get("goodput") or {}, s.get("requests") or {}
    split, stalls = s.get("split") or {}, s.get("stalls") or {}
    causes = ", ".join(f"{k} {v['count']:,}" for k, v in sorted((stalls.get("by_cause") or {}).items())) or "—"
    frac = split.get("prefill_frac")

    def flag(text: str, figure: str) -> str:
        return text + (f" — {mark}" if (mark := gone.mark(figure)) else "")

    slos = slo_text(s)
    rows = [["requests (window)", f"{req.get('total', 0):,} (ok {req.get('ok', 0):,}, errors {req.get('error', 0):,}, "
             f"timeouts {req.get('timeout', 0):,}, injected {req.get('injected', 0):,})"],
            *([["requests (before the window)", f"{req['outside_window']} ({req.get('outside_window_failed', 0)} "
                f"failed); {req.get('in_flight_at_start', 0)} still in flight when it opened, their gaps and stalls "
                "in the window counted"]] if req.get("outside_window") else []),
            ["output throughput", flag(f"{_num(thr.get('output_tokens_per_s'), '{:,.0f}')} tokens/s, "
                                       f"{_num(thr.get('requests_per_s'))} requests/s", "throughput")],
            ["goodput", flag(f"{_num(good.get('requests_per_s'))} requests/s ({good.get('good', 0)} of "
                             f"{good.get('total', 0)} met every SLO)", "goodput")],
            *([["SLOs judged", slos[0].upper() + slos[1:]]] if slos else []),
            ["stalls", flag(f"{counted(stalls.get('events') or 0, 'event')} ({stalls.get('count', 0):,} gaps), {fmt_s(stalls.get('stalled_s'))} stalled "
                            f"(stream-seconds, summed over streams), worst {fmt_s(stalls.get('worst_s'))}, "
                            f"{stalls.get('victims', 0):,} requests; by cause: {causes}" + open_note(stalls), "stalls")],
            *([["preemptions", f"{(s.get('cache') or {})['preemptions']:,} in the window, "
                f"{(s.get('cache') or {}).get('preemptions_run')} in the whole run"]]
              if (s.get("cache") or {}).get("preemptions") else []),
            ["prefill : decode", flag(f"{fmt_s(split.get('prefill_s'))} : {fmt_s(split.get('decode_s'))}"
                                      + (f" ({frac:.0%} prefill)" if frac is not None else "")
                                      + f", source {split.get('source')}", "split")],
            ["GPU (NVML)", gpu_line(s.get("gpu"))],
            ["measured window", fmt_s(data.window.seconds)]]
    check = (s.get("crosscheck") or {}).get("engine") or {}
    if (line := engine_check_line(check)) is not None:
        rows.append(["engine cross-check", line])
    figures = {"output throughput": "throughput", "goodput": "goodput", "stalls": "stalls", "prefill : decode": "split"}
    invalid = frozenset(i for i, r in enumerate(rows) if r[0] in figures and gone.mark(figures[r[0]]))
    return Table(["", ""], rows, align_right_from=9, invalid_rows=invalid)


def kv_table(title: str, d: dict[str, Any], skip: tuple[str, ...] = ()) -> Table:
    rows = [[k, "—" if v is None else str(v)] for k, v in d.items() if k not in skip and not isinstance(v, dict)]
    return Table(["setting", "value"], rows, title, align_right_from=9)


def goodput_misses(data: RunData) -> list[Table]:
    """Every SLO that requests missed, by how many and by how much (goodput explains itself)."""
    misses = (data.summary.get("goodput") or {}).get("misses") or []
    if not misses:
        return []
    rows = [[str(m.get("slo")), str(m.get("cls") or "—"), str(m.get("bucket") or "—"), fmt_s(m.get("target_s")),
             f"{m.get('missed')} of {m.get('of')}", fmt_s(m.get("median_s")), fmt_s(m.get("worst_s"))]
            for m in misses]
    return [Table(["SLO", "class", "bucket", "target", "missed", "median of the misses", "worst"], rows,
                  "Why requests missed their SLOs", align_right_from=3,
                  withdrawn=Withdrawn.of(data.summary).why("goodput") or "")]
