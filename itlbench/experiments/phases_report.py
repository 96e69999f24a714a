"""The `itlbench phases` report: prefill time and rate per prompt length beside decode rates."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import NullFormatter
from rich.console import Console

from itlbench.report.document import Callout, Document, Section, Table
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.style import (
    DECODE,
    PREFILL,
    count_log_yaxis,
    fmt_s,
    fmt_tokens,
    new_figure,
    seconds_log_yaxis,
    tidy,
)
from itlbench.report.tables import TextTable, print_table

SATURATION_SHARE = 0.9  # throughput within 10 % of its best: saturated
LINEAR_SLACK = 1.25  # per-token cost 25 % above its best: no longer linear
DECODE_PROMPT = 128  # prompt length of the batched decode requests


@dataclass
class PhasesResult:
    engine: str
    source: str
    context: int
    lengths: list[int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    decode: list[dict[str, Any]] = field(default_factory=list)
    saturation_tokens: int | None = None
    linear_until_tokens: int | None = None
    superlinear_from_tokens: int | None = None
    sim_time_scale: float = 1.0  # --engine sim --sim-time-scale: every time is this many times shorter than priced



def phases_figure(result: PhasesResult) -> FigureSpec:
    spec = FigureSpec("phases", "Prefill and decode, measured apart",
                      "Left: prefill time per prompt length (log-log) against the linear line through the best "
                      "tokens/s, shaded between the last length still linear and the first past it; right: prefill "
                      "tokens/s per length beside decode tokens/s at batch 1 and batched, dotted where prefill "
                      "throughput saturates.")
    rows = [r for r in result.rows if r["prefill_s"]]
    if not rows:
        spec.note = "No prompt length was measured."
        return spec
    n = np.array([r["prompt_tokens"] for r in rows], dtype=float)
    t = np.array([r["prefill_s"] for r in rows])
    tps = n / t
    fig = new_figure(4.0)
    left, right = fig.subplots(1, 2)
    left.plot(n, t, "o-", color=PREFILL, label="prefill time")
    best = tps.max()
    left.plot(n, n / best, "--", color="#555555", linewidth=0.9, label=f"linear at the best rate ({best:,.0f} tok/s)")
    if (span := linear_break(result)) is not None:  # shaded between the last linear length and the first past it
        lo, hi = span
        left.axvspan(lo if lo is not None else hi, hi, color="#555555", alpha=0.12, linewidth=0, zorder=0,
                     label=f"stops scaling linearly {linear_break_text(result)}")
    _lengths_xaxis(left, n)
    seconds_log_yaxis(left)
    left.set_ylabel("prefill time")
    _legend_below(left)
    tidy(left)
    right.plot(n, tps, "o-", color=PREFILL, label="prefill tokens/s")
    for d, style in zip(result.decode, ("-", "--"), strict=False):
        if d["tokens_per_s_total"]:
            right.axhline(d["tokens_per_s_total"], color=DECODE, linestyle=style,
                          label=f"decode tokens/s at batch {d['batch']}")
    if result.saturation_tokens:  # named in the legend: a label along the line sat on the curves it crosses
        right.axvline(result.saturation_tokens, color="#555555", linestyle=":", linewidth=0.8,
                      label=f"saturates at {tokens(result.saturation_tokens)}")
    _lengths_xaxis(right, n)
    count_log_yaxis(right)
    right.set_ylabel("tokens per second")
    _legend_below(right)
    tidy(right)
    spec.figure = fig
    return spec


def _legend_below(ax: Axes) -> None:
    """The panel's legend under its axis, where no curve, point or line it names can lie beneath it (inside, the
    decode lines and the curves leave no corner free for every engine)."""
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2)


def _lengths_xaxis(ax: Axes, lengths: np.ndarray) -> None:
    """A log axis of prompt tokens ticked at the lengths measured, written as the table writes them ("1k")."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [fmt_tokens(int(v)) for v in lengths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("prompt tokens")


def phases_tables(result: PhasesResult, output_tokens: int) -> tuple[Table, Table]:
    """The prefill table (one row a prompt length) and the decode table (batch 1 and batched)."""
    prefill = Table(["prompt tokens", "requests", "client TTFT", "engine prefill", "prefill tok/s",
                     "decode step (batch 1)", "decode tok/s (batch 1)"],
                    [[fmt_tokens(r["prompt_tokens"]), str(r["requests"]), fmt_s(r["client_ttft_s"]),
                      fmt_s(r["engine_prefill_s"]), f"{r['prefill_tokens_per_s']:,.0f}" if r["prefill_tokens_per_s"] else "—",
                      fmt_s(r["decode_step_s"]), f"{r['decode_tokens_per_s']:,.0f}" if r["decode_tokens_per_s"] else "—"]
                     for r in result.rows], "Prefill per prompt length (medians)")
    decode = Table(["batch (measured)", "client gap", "engine decode step", "tok/s per stream", "tok/s total"],
                   [[f"{d['batch']} ({d['batch_measured']})", fmt_s(d["client_gap_s"]), fmt_s(d["engine_step_s"]),
                     f"{d['tokens_per_s_per_stream']:,.0f}" if d["tokens_per_s_per_stream"] else "—",
                     f"{d['tokens_per_s_total']:,.0f}" if d["tokens_per_s_total"] else "—"] for d in result.decode],
                   f"Decode ({DECODE_PROMPT}-token prompts, {output_tokens} output tokens each)")
    return prefill, decode


def tokens(n: int) -> str:
    """'1 token', '512 tokens', '2k tokens'."""
    return f"{fmt_tokens(n)} token" + ("" if n == 1 else "s")


def linear_break(result: PhasesResult) -> tuple[int | None, int] | None:
    """(the longest length still linear, the first past it) where prefill time stops scaling linearly; None
    where it never does. The figure shades it and the verdict states it, from this one reading."""
    if not result.superlinear_from_tokens:
        return None
    lo = result.linear_until_tokens
    return (lo if lo is not None and lo < result.superlinear_from_tokens else None), result.superlinear_from_tokens


def linear_break_text(result: PhasesResult) -> str:
    """'between 2k and 8k tokens' (or 'by 8k tokens' with no linear length before it), as figure and verdict say it."""
    span = linear_break(result)
    if span is None:
        return ""
    lo, hi = span
    return f"between {fmt_tokens(lo)} and {tokens(hi)}" if lo is not None else f"by {tokens(hi)}"


def phases_verdict(result: PhasesResult) -> str:
    """Where prefill throughput saturates and where its time stops growing linearly, in words."""
    lines = []
    if result.saturation_tokens:
        lines.append(f"Prefill throughput saturates at about {tokens(result.saturation_tokens)} "
                     f"(tokens/s within {1 - SATURATION_SHARE:.0%} of its best): below it a longer prompt costs "
                     "little more time; above it prefill is compute-bound.")
    if linear_break(result) is not None:
        lines.append(f"Prefill time stops scaling linearly {linear_break_text(result)}: from there each token costs "
                     f"over {LINEAR_SLACK - 1:.0%} more than at the best rate (attention against the growing prefix).")
    elif result.linear_until_tokens:
        lines.append(f"Prefill time stays linear up to the longest length tried, {tokens(result.linear_until_tokens)}.")
    return " ".join(lines) or "Too few lengths to read a trend."


def time_scale_line(result: PhasesResult) -> str | None:
    """What --sim-time-scale did to every figure ('simulated at 4× speed: …'), None at the simulated GPU's speed."""
    s = result.sim_time_scale
    if s == 1:
        return None
    return f"Simulated at {s:g}× speed: every time here is 1/{s:g} of the simulated GPU's, and every rate {s:g}× its."


def phases_document(result: PhasesResult, output_tokens: int, command: str) -> Document:
    table, decode = phases_tables(result, output_tokens)
    callouts = [Callout("info", phases_verdict(result))]
    if scaled := time_scale_line(result):
        callouts.insert(0, Callout("warn", scaled))
    notes = [f"Engine: {result.engine}; times from {result.source}. Prompt context: {result.context:,} tokens. "
             "Client TTFT includes HTTP; the engine's prefill is the sum of the steps that prefilled the prompt."]
    sections = [Section("Prefill").add(*notes, phases_figure(result), table),
                Section("Decode").add("A decode step serves every running stream one token: batch 1 is one user's "
                                      "ceiling; the batched step shows what sharing the weights buys in total.",
                                      decode)]
    return Document("Prefill vs decode, measured apart", f"{result.engine} · "
                    f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}", callouts, sections,
                    command)


def read_phases(study_dir: Path) -> PhasesResult:
    """The study phases.json holds, as the report was drawn from it."""
    doc = json.loads((study_dir / "phases.json").read_text())
    return PhasesResult(**{f.name: doc[f.name] for f in fields(PhasesResult) if f.name in doc})


def print_phases(console: Console, result: PhasesResult, output_tokens: int) -> None:
    """The report's tables and verdict on the terminal, as `run` prints its figures (the figure stays in the report)."""
    for table in phases_tables(result, output_tokens):
        print_table(console, TextTable(table.caption, table.headers, table.rows))
    console.print(phases_verdict(result), highlight=False)
    if scaled := time_scale_line(result):
        console.print(f"[yellow]{scaled}[/]", highlight=False)
