"""Terminal output: a live progress line during a run and the summary tables after it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from itlbench.analysis.gpu import gpu_line
from itlbench.load.progress import ProgressSnapshot
from itlbench.report.data import read_json, run_cut_short, unreadable_line
from itlbench.report.durations import counted, fmt_s
from itlbench.report.engines import engine_check_line, serving_warnings
from itlbench.report.queueing import queueing_sentence
from itlbench.report.slos import slo_text
from itlbench.report.tables import TextTable, print_table
from itlbench.report.withdrawn import Withdrawn

BUCKET_ORDER = ("le128", "le512", "le2k", "le8k", "le32k", "gt32k")


def _ms(v: Any) -> str:
    return "—" if v is None else f"{float(v) * 1e3:,.1f}"


def _num(v: Any) -> str:
    return "—" if v is None else f"{float(v):,.1f}"


def _rate(v: Any) -> str:
    """A rate (requests/s, tokens/s); durations go through `fmt_s`."""
    return "—" if v is None else f"{float(v):,.2f}"


class LiveProgress:
    """Progress bar over the measured seconds (after warmup) plus a one-line live view of ITL and TTFT."""

    def __init__(self, console: Console, total_s: float, enabled: bool = True) -> None:
        self.enabled = enabled and console.is_terminal
        self.console = console
        self.total_s = total_s
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[line]}"), console=console, transient=False)
        self._task = self._progress.add_task("starting", total=total_s, line="")
        self._last = 0.0
        self._measure_from: float | None = None  # elapsed seconds when measurement began

    def __enter__(self) -> LiveProgress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._progress.stop()

    def status(self, text: str) -> None:
        if self.enabled:
            self._progress.update(self._task, description=text)
        else:
            self.console.print(f"[dim]{text}[/]")

    def update(self, snap: ProgressSnapshot) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.25:
            return
        self._last = now
        if snap.measuring and self._measure_from is None:
            self._measure_from = snap.elapsed_s
        measured = 0.0 if self._measure_from is None else snap.elapsed_s - self._measure_from
        stage = "warmup" if not snap.measuring else ("draining" if measured > self.total_s else "measuring")
        line = f"sent {snap.sent} done {snap.done} in-flight {snap.in_flight} err {snap.errors}"
        if snap.virtual:  # the bar runs on simulated seconds; there is no client to time
            line += f" │ simulated {fmt_s(snap.elapsed_s)}"
        else:
            line += (f" │ ITL p50 {_num(snap.itl_p50_ms)} p99 {_num(snap.itl_p99_ms)} ms │ "
                     f"TTFT p50 {_num(snap.ttft_p50_ms)} ms │ client CPU {snap.cpu_percent:.0f}%")
        self._progress.update(self._task, completed=min(measured, self.total_s), line=line, description=stage)


def _stat_row(d: dict[str, Any], keys: tuple[str, ...], fmt: Any = _ms) -> list[str]:
    return [fmt(d.get(k)) for k in keys]


def print_summary(console: Console, summary: dict[str, Any], run_dir: Path) -> None:
    """Headline tables: TTFT by bucket, ITL, stalls, split, throughput, validity."""
    reqs = summary.get("requests", {})
    console.print(f"\n[bold]Run[/] {run_dir}  requests: {reqs.get('total', 0):,} "
                  f"(ok {reqs.get('ok', 0):,}, errors {reqs.get('error', 0):,}, timeouts {reqs.get('timeout', 0):,}, "
                  f"cancelled {reqs.get('cancelled', 0):,}, injected {reqs.get('injected', 0):,})")
    if (line := _outside_line(reqs)) is not None:
        console.print(line, highlight=False)
    _print_cut_short(console, summary, run_dir)
    gone = Withdrawn.of(summary)
    ttft = TextTable("TTFT by prompt bucket", ("bucket", "count", "p50", "p90", "p99", "max"),
                     caption="— : too few requests for that percentile (p90 needs 10, p99 needs 100)")
    buckets = summary.get("ttft_s", {})
    for name in (*BUCKET_ORDER, "all"):
        b = buckets.get(name)
        if b and b.get("count"):
            label = gone.label("ttft_s" if name == "all" else f"ttft_s.{name}", name)
            ttft.add_row(label, str(b.get("count")), *_stat_row(b, ("p50", "p90", "p99", "max"), fmt_s))
    if not any("—" in cell for row in ttft.rows for cell in row[2:]):
        ttft.caption = None  # the key explains a mark the table does not show
    print_table(console, ttft)
    _print_withdrawn(console, gone, "TTFT", "ttft_s")
    if (held := queueing_sentence(summary)) is not None:  # the report's sentence under its TTFT table
        console.print(held, highlight=False, markup=False)
    _print_injected(console, summary, gone)
    itl = summary.get("itl_s", {})
    itl_t = TextTable("Inter-token latency, pooled per gap, steady streams (ms)",
                      ("gaps", "p50", "p90", "p95", "p99", "p99.9", "max"), labels=0,
                      caption=None if (itl.get("count") or 0) >= 1000 else "— : too few gaps for that percentile")
    itl_t.add_row(str(itl.get("count", 0)), *_stat_row(itl, ("p50", "p90", "p95", "p99", "p999", "max")))
    print_table(console, itl_t)
    _print_withdrawn(console, gone, "ITL", "itl_s")
    _print_reasoning(console, summary.get("reasoning"))
    stalls = summary.get("stalls", {})
    split = summary.get("split", {})
    thr = summary.get("throughput", {})
    console.print(f"[bold]Stalls[/]: {counted(stalls.get('count', 0), 'gap')}, {fmt_s(stalls.get('stalled_s'))} stalled "
                  f"(stream-seconds, summed over streams), worst {fmt_s(stalls.get('worst_s'))}, "
                  f"{counted(stalls.get('victims', 0), 'victim request')}, {counted(stalls.get('events', 0), 'event')}",
                  highlight=False)
    _print_withdrawn(console, gone, "Stalls", "stalls")
    if (line := open_stall_line(stalls)) is not None:
        console.print(f"  [yellow]{line}[/]", highlight=False)
    causes = stalls.get("by_cause") or {}
    if causes:
        console.print("  by cause: " + ", ".join(f"{k} {v['count']:,} ({fmt_s(v['stalled_s'])} stalled)"
                                                   for k, v in sorted(causes.items())), highlight=False)
    for ev in (stalls.get("attribution") or [])[:3]:
        console.print(f"  • {_event_line(ev)}", highlight=False)
    frac = split.get("prefill_frac")
    console.print(f"[bold]Prefill:decode[/] {fmt_s(split.get('prefill_s'))} : {fmt_s(split.get('decode_s'))}"
                  + (f" ({frac * 100:.0f} % prefill)" if frac is not None else "")
                  + f"  [dim]source: {split.get('source', 'unavailable')}[/]", highlight=False)
    _print_withdrawn(console, gone, "Prefill:decode", "split")
    console.print(f"[bold]Throughput[/] {_rate(thr.get('requests_per_s'))} req/s, "
                  f"{_rate(thr.get('output_tokens_per_s'))} output tok/s")
    _print_withdrawn(console, gone, "Throughput", "throughput")
    offered = summary.get("offered") or {}
    if offered.get("line"):  # open loop: the arrivals its window held against the nominal --rate
        console.print(f"[bold]Offered[/] {escape(str(offered['line']).removeprefix('Offered '))}", highlight=False)
        if offered.get("note"):
            console.print(f"  [yellow]{escape(str(offered['note']))}[/]", highlight=False)
    console.print(f"[bold]GPU[/] {escape(gpu_line(summary.get('gpu')))}", highlight=False)
    _print_goodput(console, summary, gone)
    bundling = summary.get("bundling") or {}
    if bundling.get("warning"):
        console.print(f"[yellow]warning:[/] {bundling['warning']}")
    together = summary.get("arrived_together") or {}
    if together.get("warning"):
        console.print(f"[bold red]warning:[/] {escape(str(together['warning']))}", highlight=False)
    _print_observer(console, summary)
    check = (summary.get("crosscheck") or {}).get("engine") or {}
    if (line := engine_check_line(check)) is not None:
        console.print(f"[bold]Engine check[/] {line}", highlight=False)
    _print_validity(console, summary)
    clock = summary.get("clock") or {}
    if clock.get("kind") == "virtual":
        console.print(f"[bold]Clock[/] virtual: {escape(str(clock.get('note') or 'simulated time'))}", highlight=False)
    if isinstance(summary.get("sim_check"), dict):
        from itlbench.sim.accuracy import check_line  # simulated runs only

        console.print(f"[bold]Sim check[/] {escape(check_line(summary['sim_check']))}", highlight=False)
    if (lost := unreadable_line(summary)) is not None:
        console.print(f"[bold red]warning:[/] {escape(lost)}", highlight=False)
    print_engine_warnings(console, run_dir)


def _print_reasoning(console: Console, r: dict[str, Any] | None) -> None:
    """Only for runs where some request reasoned: TTFT to the first answer token beside TTFT, and the
    reasoning and answer phases' ITL apart (the gap into the answer counts as the answer's)."""
    if not r:
        return
    share = r.get("request_share")
    chunk = r.get("chunk_share")
    console.print(f"[bold]Reasoning[/] {r.get('requests', 0)} requests reasoned"
                  + (f" ({share:.0%} of those with a first token)" if share is not None else "")
                  + (f", {chunk:.0%} of their chunks reasoning" if chunk is not None else "")
                  + f"; {r.get('answered', 0)} reached an answer", highlight=False)
    table = TextTable("Reasoning streams: first answer token and ITL by phase (ms)",
                      ("figure", "count", "p50", "p90", "p99", "max"),
                      caption="ITL answer includes the gap into the answer (also alone as 'gap into answer')")
    ttfa = (r.get("ttfa_s") or {}).get("all") or {}
    keys = ("p50", "p90", "p99", "max")
    table.add_row("TTFA", str(ttfa.get("count", 0)), *_stat_row(ttfa, keys, fmt_s))
    reason = r.get("reasoning_s") or {}
    table.add_row("reasoning time", str(reason.get("count", 0)), *_stat_row(reason, keys, fmt_s))
    for label, key in (("ITL reasoning (ms)", "itl_reasoning_s"), ("ITL answer (ms)", "itl_answer_s"),
                       ("gap into answer (ms)", "handoff_s")):
        d = r.get(key) or {}
        table.add_row(label, str(d.get("count", 0)), *_stat_row(d, keys))
    print_table(console, table)


def engine_warnings(run_dir: Path) -> list[str]:
    """The engine's warnings in the run directory's run.json (none when it cannot be read)."""
    doc = read_json(run_dir / "run.json")
    return [] if doc is None else serving_warnings(doc)


def cut_short(summary: dict[str, Any], run_dir: Path) -> list[str]:
    """Why the run ended early (aborted, interrupted, the server died); empty when it ran its course."""
    doc = read_json(run_dir / "run.json")
    return [] if doc is None else run_cut_short(doc, float((summary.get("window") or {}).get("seconds") or 0.0))


def _print_cut_short(console: Console, summary: dict[str, Any], run_dir: Path) -> None:
    """`cut_short`, before the figures it leaves thin or empty."""
    if reasons := cut_short(summary, run_dir):
        console.print(f"[bold red]Cut short[/]: {escape('; '.join(reasons))} (every record it collected is in "
                      f"{escape(str(run_dir))}/requests)", highlight=False)


def print_engine_warnings(console: Console, run_dir: Path) -> None:
    for warning in engine_warnings(run_dir):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def _print_withdrawn(console: Console, gone: Withdrawn, name: str, figure: str) -> None:
    """Under a figure the run's validity verdict withdrew: that it is not valid, and why (as the report says)."""
    if (mark := gone.mark(figure)):
        console.print(f"  [bold red]{escape(name)} {escape(mark.split(': ', 1)[0])}[/]: {escape(mark.split(': ', 1)[1])}",
                      highlight=False)


def _print_goodput(console: Console, summary: dict[str, Any], gone: Withdrawn | None = None) -> None:
    """Goodput with the SLOs it was judged against (the defaults, said so, where no --slo was given) and the
    reason it is what it is: each SLO missed, by how many requests and how far."""
    good = summary.get("goodput") or {}
    console.print(f"[bold]Goodput[/] {_rate(good.get('requests_per_s'))} req/s ({good.get('good', 0)} of "
                  f"{good.get('total', 0)} requests met every SLO)")
    if (slos := slo_text(summary)) is not None:
        console.print(f"  judged against {escape(slos)}", highlight=False)
    _print_withdrawn(console, gone or Withdrawn.of(summary), "Goodput", "goodput")
    if good.get("not_ok"):
        console.print(f"  {good['not_ok']} requests did not complete (error, timeout or cancelled)")
    for miss in (good.get("misses") or [])[:5]:
        what = f"TTFT {miss.get('bucket')}" if miss["slo"] == "ttft" else f"ITL {miss['slo'].removeprefix('itl_')}"
        console.print(f"  missed {what} ≤ {fmt_s(miss.get('target_s'))} ({miss.get('cls')}): {miss.get('missed')} of "
                      f"{miss.get('of')} requests, median {fmt_s(miss.get('median_s'))}, worst "
                      f"{fmt_s(miss.get('worst_s'))}", highlight=False)


def _print_validity(console: Console, summary: dict[str, Any]) -> None:
    if summary.get("valid") is not False:
        return
    v = summary.get("validity") or {}
    outside = v.get("disturbances") or []
    client = [r for r in v.get("reasons") or [] if r not in outside]
    if client:
        console.print("[bold red]Client-distorted figures[/]: " + "; ".join(client))
    if outside:
        console.print("[bold red]Disturbed between client and engine[/]: " + "; ".join(outside))
    console.print(f"  affected: {', '.join(v.get('affected') or [])}; still standing: "
                  f"{', '.join(v.get('standing') or []) or 'none'}"
                  + (" (spread the load with --workers N, or run the client on another machine)" if client else ""))


def _cached(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("cached_tokens") is None:
        return ""
    return f"; cached {entry['cached_tokens']:,} tokens ({entry['cached_fraction'] or 0:.0%})"


def _print_injected(console: Console, summary: dict[str, Any], gone: Withdrawn | None = None) -> None:
    """Each injected prompt's TTFT beside the engine's own prefill span for it, when it has one, and the
    prompt tokens the server says it served from its prefix cache; '(not valid)' on a TTFT the verdict withdrew."""
    bad = " (not valid)" if (gone or Withdrawn.of(summary)).why("ttft_by_class_s.injected") else ""
    by_class = (summary.get("ttft_by_class_s") or {}).get("injected") or {}
    checks = ((summary.get("crosscheck") or {}).get("engine") or {}).get("injected") or []
    cache = {c["request_id"]: c for c in (summary.get("cache") or {}).get("injected") or []}
    for c in checks:
        console.print(f"[bold]Injected[/] {c['request_id']} ({c['prompt_tokens']:,} tokens): TTFT "
                      f"{fmt_s(c['client_ttft_s'])}{bad}; engine prefill {fmt_s(c['engine_prefill_span_s'])} over "
                      f"{c['prefill_steps']} step{'' if c['prefill_steps'] == 1 else 's'}"
                      f"{_cached(cache.get(c['request_id']))}", highlight=False)
    if not checks and cache:
        for c in list(cache.values())[:8]:
            console.print(f"[bold]Injected[/] {c['request_id']} ({c['prompt_tokens'] or 0:,} tokens): TTFT "
                          f"{fmt_s(c['ttft_s'])}{bad}{_cached(c)}", highlight=False)
    elif not checks and by_class.get("count"):
        console.print(f"[bold]Injected[/] {by_class['count']} prompts: TTFT p50 {fmt_s(by_class.get('p50'))}, "
                      f"max {fmt_s(by_class.get('max'))}{bad}", highlight=False)


def _print_observer(console: Console, summary: dict[str, Any]) -> None:
    """Failed requests, the prefix cache the server reported, and how /metrics was read."""
    failures = summary.get("failures") or {}
    if failures.get("line"):
        console.print(f"[bold red]Failures[/] {failures['line']}", highlight=False)
    cache = summary.get("cache") or {}
    server = cache.get("server") or {}
    if cache.get("requests_reporting") or server:
        parts = []
        if cache.get("requests_reporting"):
            parts.append(f"{cache.get('cached_tokens') or 0:,} of {cache.get('prompt_tokens') or 0:,} prompt tokens "
                         f"cached ({cache.get('cached_fraction') or 0:.0%}, usage of {cache['requests_reporting']} "
                         "requests)")
        if server.get("hit_fraction") is not None:
            parts.append(f"engine counters {server['hit_fraction']:.0%} hits")
        if cache.get("preemptions"):
            parts.append(f"{_preempted(cache)} (a re-prefill after a preemption hits the cache)")
        console.print("[bold]Prefix cache[/] " + "; ".join(parts), highlight=False)
    if cache.get("preemptions"):
        console.print(f"[bold]Preemptions[/] {_preempted(cache, '')}", highlight=False)
    for warning in [w for w in cache.get("warnings") or [] if "preemptions in the window" not in w]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    starved = (summary.get("client_pauses") or {}).get("line")
    if starved:
        console.print(f"[yellow]warning:[/] {starved}", highlight=False)
    scrapes = summary.get("scrapes") or {}
    if scrapes.get("count"):
        reasons = ", ".join(f"{k} {v}" for k, v in (scrapes.get("by_reason") or {}).items())
        inside = scrapes.get("in_window") or 0
        console.print(f"[bold]/metrics[/] {scrapes['count']} scrapes ({reasons}), "
                      f"{inside if inside else 'none'} inside the window, longest {fmt_s(scrapes.get('longest_s'))}"
                      + (f", {scrapes['failed']} failed" if scrapes.get("failed") else ""))


def _preempted(cache: dict[str, Any], noun: str = " preemptions") -> str:
    run = cache.get("preemptions_run")
    return f"{cache['preemptions']:,}{noun} in the window" + (f" ({run:,} in the whole run)" if run else "")


def _outside_line(reqs: dict[str, Any]) -> str | None:
    """Requests sent before the window: those still streaming (or frozen) in it count in its gaps and
    stalls, so they are not called warm-up."""
    outside, carried = reqs.get("outside_window") or 0, reqs.get("in_flight_at_start") or 0
    if not (reqs.get("outside_window_failed") or (outside and not reqs.get("total"))):
        return None  # streams carrying their first requests into the window are every closed-loop run's normal
    line = f"  and {outside} sent before the measured window"
    if carried:
        line += (f": {carried} still in flight when it opened (their gaps and stalls in the window count; "
                 f"{reqs.get('in_flight_at_start_failed', 0)} of them did not finish ok)")
        warmup_failed = (reqs.get("outside_window_failed") or 0) - (reqs.get("in_flight_at_start_failed") or 0)
        return line + f", {outside - carried} done in the warm-up ({warmup_failed} failed)"
    return line + f" (warm-up), {reqs.get('outside_window_failed', 0)} of them failed"


def open_stall_line(stalls: dict[str, Any]) -> str | None:
    """The stalls no token closed in the window, in words: a stream may well have resumed after it."""
    opened = stalls.get("open") or {}
    if not opened.get("count"):
        return None
    at_end = opened.get("at_window_end") or 0
    return (f"{opened['count']} of them open ({fmt_s(opened.get('stalled_s'))} stalled): no token ended them in "
            f"the window; {at_end} still stalled when the window closed (counted to the window's end, a lower "
            f"bound), {opened['count'] - at_end} cut while stalled")


def _event_line(ev: dict[str, Any]) -> str:
    injected = list(ev.get("injected_request_ids") or [])
    others = [r for r in (ev.get("prefill_request_ids") or []) if r not in injected]
    who = ", ".join([f"{r} (injected)" for r in injected[:3]] + [str(r) for r in others[:3]]) or "no prefill step"
    more = len(injected) + len(others) - min(len(injected), 3) - min(len(others), 3)
    cause = ev.get("cause") or "unknown"
    if cause == "unknown" and ev.get("unknown_reason"):
        cause += f" ({str(ev['unknown_reason']).replace('_', ' ')})"
    line = (f"worst {fmt_s(ev.get('worst_s'))} across {counted(ev.get('victims', '?'), 'request')} "
            f"({fmt_s(ev.get('stalled_s'))} stalled, stream-seconds), cause: {cause}")
    if ev.get("prefill_steps"):
        line += (f"; overlapping prefill: {who}{f' +{more} more' if more > 0 else ''} "
                 f"({ev.get('prefill_tokens', 0)} tokens, {fmt_s(ev.get('prefill_s'))})")
    elif ev.get("longest_step_s") is not None:
        line += f"; longest engine step {fmt_s(ev.get('longest_step_s'))}"
    return line


def print_catalog(console: Console, rows: list[dict[str, Any]]) -> None:
    """The workload catalog; its notes are prose, so they wrap instead of the table turning."""
    if not rows:
        console.print("(empty catalog)")
        return
    columns = [col for col in rows[0] if col != "in_out"]  # the two means already say it; the notes get the room
    table = TextTable("Workloads (prompt and output tokens, lognormal around the means)",
                      [col.replace("_", " ") for col in columns], turnable=False,
                      left=tuple(i for i, col in enumerate(columns) if not col.startswith("mean")))
    for row in rows:
        per_turn = str(row.get("in_out", "")).endswith("per turn")  # a session's means are each turn's
        table.add_row(*[("means per turn; " if col == "notes" and per_turn else "") + str(row[col]) for col in columns])
    print_table(console, table)
