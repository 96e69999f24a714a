"""One line per run: what `itlbench run --brief` prints, and so each point of a sweep or a capacity search.

A point's tables live in its run directory (`itlbench analyze DIR` prints them, `report.html` draws them);
a capacity search printing fourteen points' tables (~850 lines) buried its own progress and answer.
The line keeps what a reader scans a list of points for: requests, TTFT, ITL, the worst stall, output
throughput, goodput, the rate offered (open loop) and whether the run is valid: where it is not, the first reason
in full and every other in a few words (report/withdrawn.py's), so a second reason is never hidden behind the
first (the report's banner has every sentence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from itlbench.report.durations import counted, fmt_s
from itlbench.report.withdrawn import Withdrawn


def brief_line(summary: dict[str, Any], run_dir: Path | str) -> str:
    """`DIR: 478 of 478 ok · TTFT p50 39 ms p99 173 ms · ITL p50 9.2 ms p99 53 ms · ...`; a figure the run's
    validity verdict withdrew is marked where it stands ("ITL p50 0 ms … (not valid)"), so a list of points
    never shows a buffered server's 0 ms gaps or its goodput as measured."""
    withdrawn = Withdrawn.of(summary)
    figures = [(_ttft(summary), "ttft_s"), (_itl(summary), "itl_s"), (_stalls(summary), "stalls"),
               (_throughput(summary), "throughput")]
    goodput = (summary.get("goodput") or {}).get("fraction")
    if goodput is not None:
        figures.append((f"goodput {goodput:.0%}", "goodput"))
    parts = [_requests(summary), _offered(summary), *(_marked(text, figure, withdrawn) for text, figure in figures),
             _validity(summary)]
    return f"{run_dir}: " + " · ".join(p for p in parts if p)


def _marked(text: str, figure: str, withdrawn: Withdrawn) -> str:
    """`text (not valid)`, or `(max not valid)` where only a part of the figure was withdrawn."""
    return withdrawn.label(figure, text) if text else text


def _requests(summary: dict[str, Any]) -> str:
    reqs = summary.get("requests") or {}
    return f"{reqs.get('ok', 0):,} of {reqs.get('total', 0):,} ok"


def _offered(summary: dict[str, Any]) -> str:
    """Open loop: the rate the window's arrivals made, beside the nominal one (a short window falls short)."""
    offered = summary.get("offered") or {}
    if offered.get("offered_rps") is None or offered.get("nominal_rps") is None:
        return ""
    unit = offered.get("unit") or "req/s"  # sessions/s where agent sessions arrive at --rate
    return f"offered {offered['offered_rps']:.1f} of the nominal {offered['nominal_rps']:.1f} {unit}"


def _ttft(summary: dict[str, Any]) -> str:
    ttft = summary.get("ttft_s") or {}
    every = ttft.get("all") or {}
    line = f"TTFT p50 {fmt_s(every.get('p50'))} p99 {fmt_s(every.get('p99'))}"
    injected = (summary.get("ttft_by_class_s") or {}).get("injected") or {}
    if injected.get("count"):  # the long prompt's own wait: the sweep's price of a smaller budget
        line += f" (injected, longest {fmt_s(injected.get('max'))})"
    return line


def _itl(summary: dict[str, Any]) -> str:
    itl = summary.get("itl_s") or {}
    return f"ITL p50 {fmt_s(itl.get('p50'))} p99 {fmt_s(itl.get('p99'))} max {fmt_s(itl.get('max'))}"


def _stalls(summary: dict[str, Any]) -> str:
    stalls = summary.get("stalls") or {}
    events = stalls.get("events") or 0
    if not events:
        return "no stalls"
    return f"{counted(events, 'stall event')} (worst {fmt_s(stalls.get('worst_s'))})"


def _throughput(summary: dict[str, Any]) -> str:
    rate = (summary.get("throughput") or {}).get("output_tokens_per_s")
    return "" if rate is None else f"{rate:,.0f} output tok/s"


def _validity(summary: dict[str, Any]) -> str:
    if not (summary.get("requests") or {}).get("total"):
        return "measured nothing"  # no request in the window: nothing to be valid about
    if summary.get("valid", True):
        return "valid"
    reasons = [str(r) for r in (summary.get("validity") or {}).get("reasons") or []]
    if not reasons:
        return "NOT valid"
    first, *others = [r.words for r in Withdrawn.of({**summary, "valid": False}).reasons]
    rest = [w for w in dict.fromkeys(others) if w != first]  # each other reason once, in a few words
    return f"NOT valid: {reasons[0]}" + (f" (and {len(rest)} more: {'; '.join(rest)})" if rest else "")
