"""The TTFT figure's right panel: where a bucket's TTFT went, for its typical request and for its slow ones.

A full running batch makes a TTFT's tail all queueing while its median stays prefill: one bar of the parts'
medians per bucket read "mostly prefill" beside a p90 of 2 s spent waiting. So each bucket gets two bars, each
part's median over the whole bucket and over its slowest 10 % (its ⌈n/10⌉ longest TTFTs), each bar scaled to 100 %.
"""

from __future__ import annotations

import polars as pl
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter

from itlbench.analysis.stats import min_samples
from itlbench.report.durations import fmt_s
from itlbench.report.style import DPI, MUTED, PREFILL

TAIL_Q = 0.9
OFFSET = 0.2  # a bar's centre from its bucket's: the two bars of a bucket sit close, buckets apart
HEIGHT = 0.36
GROUP_FONT = 7.0
BUCKET_FONT = 8.0
MINOR_TICK, MINOR_PAD = 2.0, 3.5  # points
QUEUE = "#f2a900"

Part = tuple[str, str, str]  # column, legend name, colour


def ttft_parts(ax: Axes, t: pl.DataFrame, present: list[str], has_steps: bool) -> None:
    """Per bucket a "median" bar and a "slowest 10 %" bar of the TTFT's parts; the group names label the bars,
    the bucket names sit left of them."""
    parts = _parts(has_steps)
    groups: list[tuple[float, str]] = []
    for i, b in enumerate(present):
        rows = t.filter(pl.col("bucket") == b)
        groups.append((i - OFFSET, _median(ax, i - OFFSET, rows, parts)))
        groups.append((i + OFFSET, _tail(ax, i + OFFSET, rows, parts)))
    _axes(ax, present, groups, parts)


def tail_rows(rows: pl.DataFrame) -> pl.DataFrame | None:
    """A bucket's slowest 10 %: its ⌈n/10⌉ longest TTFTs (by rank, not "at or above p90", which takes in every
    request tied at the p90); None under 10 requests, too few to have a tenth apart (stats' rule for a p90)."""
    timed = rows.drop_nulls("ttft_s")
    if timed.height < min_samples(TAIL_Q):
        return None
    return timed.sort("ttft_s", descending=True, maintain_order=True).head(-(-timed.height // 10))


def _parts(has_steps: bool) -> tuple[Part, ...]:
    if has_steps:
        return ("client_lag_s", "client lag", MUTED), ("queue_s", "server queue", QUEUE), ("prefill_s", "prefill", PREFILL)
    return ("client_lag_s", "client lag", MUTED), ("server_s", "server (queue + prefill; no step log)", PREFILL)


def _median(ax: Axes, y: float, rows: pl.DataFrame, parts: tuple[Part, ...]) -> str:
    """Draw the median bar; none for one request, whose TTFT the table's p50 withholds too (stats' rule)."""
    if rows.drop_nulls("ttft_s").height < min_samples(0.5):
        return f"median: n<{min_samples(0.5)}"
    return "median" if _bar(ax, y, rows, parts) else "median: parts unknown"


def _tail(ax: Axes, y: float, rows: pl.DataFrame, parts: tuple[Part, ...]) -> str:
    """Draw the slowest 10 %'s bar; returns its label, which says why where there is none."""
    slow = tail_rows(rows)
    if slow is None:
        return f"slowest 10 %: n<{min_samples(TAIL_Q)}"
    fastest = float(slow["ttft_s"].min())  # type: ignore[arg-type]
    return f"slowest 10 % (≥{fmt_s(fastest)})" if _bar(ax, y, slow, parts) else "slowest 10 %: parts unknown"


def _bar(ax: Axes, y: float, rows: pl.DataFrame, parts: tuple[Part, ...]) -> bool:
    """One stacked bar of the parts' medians as shares of their sum; none (False) where no request has every
    part known, rather than a known client lag drawn as 100 %."""
    rows = rows.drop_nulls([c for c, _, _ in parts])
    if not rows.height:
        return False
    meds = [max(0.0, float(rows[c].median() or 0.0)) for c, _, _ in parts]  # type: ignore[arg-type]
    total = sum(meds) or 1.0
    left = 0.0
    for (_, _, color), v in zip(parts, meds, strict=True):
        ax.barh(y, v / total, left=left, color=color, height=HEIGHT)
        left += v / total
    return True


def _width_pt(text: str, size: float) -> float:
    """A label's width as the report's Agg canvas draws it, in points (a TextPath's outline runs 5 % short)."""
    width, _, _ = RendererAgg(1, 1, DPI).get_text_width_height_descent(text, FontProperties(size=size), ismath=False)
    return float(width) * 72.0 / DPI


def _axes(ax: Axes, present: list[str], groups: list[tuple[float, str]], parts: tuple[Part, ...]) -> None:
    """Group names as minor ticks at their bars, bucket names as major ticks padded clear of the widest group name."""
    ax.set_yticks([y for y, _ in groups], [name for _, name in groups], minor=True, fontsize=GROUP_FONT)
    ax.set_yticks(range(len(present)), present, fontsize=BUCKET_FONT)
    widest = max(_width_pt(name, GROUP_FONT) for _, name in groups)
    ax.tick_params(axis="y", which="minor", length=MINOR_TICK, pad=MINOR_PAD)
    ax.tick_params(axis="y", which="major", length=0, pad=MINOR_TICK + MINOR_PAD + widest + 8)
    ax.set_ylim(len(present) - 0.5, -0.5)  # the first bucket on top, its median bar above its tail
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))  # as the prefill:decode split reads
    ax.set_xlabel("share of the group's TTFT (each part's median)")
    ax.legend(handles=[Patch(color=c, label=n) for _, n, c in parts], fontsize=7, frameon=False,
              loc="lower right", bbox_to_anchor=(1, 1), ncols=len(parts))
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
