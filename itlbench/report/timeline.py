"""The stall picture: every stream's tokens over time, where they froze, and why.

One row per steady stream (closed-loop streams keep their index; open-loop requests are packed
into lanes so rows stay few). A row is drawn in the streaming colour while its gaps are ordinary and
in its cause's colour across each stalled gap, so a prefill that freezes every stream shows as one
vertical band. The injected prompts' prefill spans (from the engine's step log; from the client's
send → first token when there is none) are shaded behind, and the lower panel gives the gaps' sizes:
every stall, over a background sample of the ordinary gaps.

Drawn from per-request spans and the stalls (analysis/scale.py), never from every gap: a stream's
rows are its spans with the stalls cut out, and bars closer than a pixel apart are merged
(`merge_close`), so an hour at 1,000 streams draws in seconds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from itlbench.report.data import RunData
from itlbench.report.style import (
    CAUSE_COLORS,
    CAUSE_NAMES,
    INJECTED_SPAN,
    MUTED,
    STREAMING,
    WAITING,
    fit_labels,
    fmt_s,
    fmt_tokens,
    new_figure,
    seconds_log_yaxis,
    tidy,
    time_axis,
)


@dataclass(frozen=True)
class InjectedSpan:
    """One injected prompt's prefill, seconds from measure start."""

    request_id: str
    start_s: float
    end_s: float
    prompt_tokens: int | None
    steps: int  # engine steps that prefilled it; 0 = client view only
    ttft_s: float | None

    @property
    def label(self) -> str:
        size = f"{fmt_tokens(self.prompt_tokens)} tokens" if self.prompt_tokens else "?"
        how = f"prefilled in {self.steps} step{'s' if self.steps != 1 else ''}" if self.steps \
            else "waiting for its first token (client view)"
        return f"{self.request_id} ({size}) {how}"


def injected_spans(data: RunData, whole_run: bool = False) -> list[InjectedSpan]:
    """Each injected request's prefill: its engine steps' span, else send → first token (those
    overlapping the measured window, or every one with `whole_run`)."""
    req = data.tables["requests"].filter(pl.col("injected").fill_null(False))
    if req.is_empty():
        return []
    steps = data.steps.select("start_ns", "end_ns", pl.col("prefill_request_ids").alias("sid")).explode("sid")
    out = []
    for r in req.sort("scheduled_ns").iter_rows(named=True):
        mine = steps.filter(pl.col("sid") == r["server_request_id"]) if r["server_request_id"] else steps.clear()
        if mine.height:
            lo, hi, n = int(mine["start_ns"].min()), int(mine["end_ns"].max()), mine.height  # type: ignore[arg-type]
        elif r["sent_ns"] is not None and (r["first_token_ns"] or r["done_ns"]):
            lo, hi, n = int(r["sent_ns"]), int(r["first_token_ns"] or r["done_ns"]), 0
        else:
            continue
        ttft = (r["first_token_ns"] - r["scheduled_ns"]) / 1e9 if r["first_token_ns"] and r["scheduled_ns"] else None
        out.append(InjectedSpan(r["request_id"], (lo - data.t0_ns) / 1e9, (hi - data.t0_ns) / 1e9,
                                r["prompt_tokens"], n, ttft))
    return out if whole_run else [s for s in out if s.end_s > 0 and s.start_s < data.window.seconds]


def lanes(requests: pl.DataFrame, extra_ids: Iterable[str] = ()) -> tuple[dict[str, int], int, int]:
    """request_id → row. Steady closed-loop streams keep their index; open-loop requests are
    packed greedily by their [sent, done] span; injected requests get their own rows on top.
    Returns (mapping, number of steady rows, total rows)."""
    mapping: dict[str, int] = {}
    closed = requests.filter(pl.col("stream").is_not_null() & ~pl.col("injected").fill_null(False))
    streams = sorted(closed["stream"].unique().to_list())
    index = {s: i for i, s in enumerate(streams)}
    for rid, stream in closed.select("request_id", "stream").iter_rows():
        mapping[rid] = index[stream]
    n = len(streams)
    free_at: list[int] = []
    open_ = requests.filter(pl.col("stream").is_null() & ~pl.col("injected").fill_null(False))
    spans = open_.select("request_id", pl.coalesce("sent_ns", "scheduled_ns").alias("lo"),
                         pl.coalesce("done_ns", "last_token_ns", "sent_ns").alias("hi")).sort("lo")
    for rid, lo, hi in spans.iter_rows():
        lane = next((i for i, t in enumerate(free_at) if lo is not None and t <= lo), None)
        if lane is None:
            free_at.append(0)
            lane = len(free_at) - 1
        free_at[lane] = hi or lo or 0
        mapping[rid] = n + lane
    steady_rows = n + len(free_at)
    for rid in sorted(set(extra_ids) - set(mapping) - set(requests["request_id"].to_list())):
        mapping[rid] = steady_rows  # chunks whose request row was never written (a killed run)
        steady_rows += 1
    injected = requests.filter(pl.col("injected").fill_null(False)).sort("scheduled_ns")
    for i, rid in enumerate(injected["request_id"].to_list()):
        mapping[rid] = steady_rows + i
    return mapping, steady_rows, steady_rows + injected.height


def layout(data: RunData) -> tuple[dict[str, int], int, int]:
    """lanes() of a run, including streams whose request rows a killed run never wrote."""
    spans = data.chunks.spans
    ids = spans.filter(~pl.col("injected"))["request_id"].to_list() if spans is not None and spans.height else []
    return lanes(data.tables["requests"], ids)


def _segments(data: RunData) -> pl.DataFrame:
    """Per request: the runs of ordinary gaps between its stalls (cause 'streaming': from its first gap
    in the window, or a stall's end, to the next stall's start, or its last gap) and each stalled gap on
    its own, so the tokens that arrive between stalls stay visible as thin white lines."""
    spans = data.chunks.spans
    if spans is None or spans.is_empty():
        return pl.DataFrame(schema={"request_id": pl.Utf8, "cause": pl.Utf8, "lo_ns": pl.Int64, "hi_ns": pl.Int64})
    span = spans.select("request_id", pl.col("lo_ns").alias("span_lo"), pl.col("hi_ns").alias("span_hi"))
    st = (data.stalls.select("request_id", pl.col("t_prev_ns").alias("lo_ns"), pl.col("t_ns").alias("hi_ns"),
                             pl.col("cause").fill_null("unknown")).sort("request_id", "lo_ns")
          .with_columns(pl.col("hi_ns").shift(1).over("request_id").alias("prev_hi")))
    before = (st.join(span, on="request_id").select(
        "request_id", pl.lit("streaming").alias("cause"), pl.coalesce("prev_hi", "span_lo").alias("lo_ns"),
        pl.col("lo_ns").alias("hi_ns")))
    last = st.group_by("request_id").agg(pl.col("hi_ns").max().alias("last_hi"))
    tail = (span.join(last, on="request_id", how="left").select(
        "request_id", pl.lit("streaming").alias("cause"), pl.coalesce("last_hi", "span_lo").alias("lo_ns"),
        pl.col("span_hi").alias("hi_ns")))
    streaming = pl.concat([before, tail]).filter(pl.col("hi_ns") > pl.col("lo_ns"))
    return pl.concat([streaming, st.select("request_id", "cause", "lo_ns", "hi_ns")]).sort("request_id", "lo_ns")


def merge_close(xs: list[tuple[float, float]], tol: float) -> list[tuple[float, float]]:
    """(start, width) bars of one row, merged where less than `tol` apart (a pixel: nothing is lost)."""
    if len(xs) < 2:
        return xs
    a = np.array(sorted(xs))
    start, end = a[:, 0], a[:, 0] + a[:, 1]
    reach = np.maximum.accumulate(end)
    new = np.concatenate([[True], start[1:] > reach[:-1] + tol])
    groups = np.cumsum(new) - 1
    lo = start[new]
    hi = np.zeros(lo.size)
    np.maximum.at(hi, groups, end)
    return list(zip(lo.tolist(), (hi - lo).tolist(), strict=True))


def add_bars(ax: Axes, rows: dict[int, list[tuple[float, float]]], half: float, **style: object) -> None:
    """(start, width) bars of many rows as one collection (one broken_barh per row costs ~10 ms each)."""
    rects = [(x, w, row) for row, xs in rows.items() for x, w in xs]
    if not rects:
        return
    a = np.array(rects, dtype=float)
    x0, x1, y0, y1 = a[:, 0], a[:, 0] + a[:, 1], a[:, 2] - half, a[:, 2] + half
    verts = np.stack([np.column_stack(p) for p in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)
    ax.add_collection(PolyCollection(verts, **style), autolim=False)  # type: ignore[arg-type]


def draw_rows(ax: Axes, data: RunData, spans: list[InjectedSpan], compact: bool = False) -> None:
    """The per-stream rows: streaming colour while tokens flow, the cause's colour across stalls."""
    mapping, steady_rows, total = layout(data)
    segs = _segments(data)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    t0 = data.t0_ns
    tol = max(data.window.seconds, 1e-9) / 4000  # under a pixel of the widest figure
    for rid, cause, lo, hi in segs.select("request_id", "cause", "lo_ns", "hi_ns").iter_rows():
        row = mapping.get(rid)
        if row is None:
            continue
        bars[(row, cause)].append(((lo - t0) / 1e9, max((hi - lo) / 1e9, 1e-4)))
    for span in spans:
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.18, linewidth=0, zorder=0)
    waiting = data.tables["requests"].filter(pl.col("injected").fill_null(False))
    for rid, sent, first in waiting.select("request_id", "sent_ns", pl.coalesce("first_token_ns", "done_ns")).iter_rows():
        if rid in mapping and sent is not None and first is not None:
            ax.broken_barh([((sent - t0) / 1e9, (first - sent) / 1e9)], (mapping[rid] - 0.35, 0.7),
                           facecolor="none", edgecolor=INJECTED_SPAN, hatch="///", linewidth=0.8)
    steady = data.tables["requests"].filter(~pl.col("injected").fill_null(False))
    waits: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for rid, sent, first in steady.select("request_id", "sent_ns", "first_token_ns").drop_nulls().iter_rows():
        if rid in mapping and first > t0:
            waits[mapping[rid]].append(((sent - t0) / 1e9, (first - sent) / 1e9))
    add_bars(ax, {row: merge_close(xs, tol) for row, xs in waits.items()}, 0.12, facecolors=WAITING, linewidths=0)
    by_cause: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(dict)
    for (row, cause), xs in bars.items():
        by_cause[cause][row] = merge_close(xs, tol) if len(xs) > 64 else xs
    # Hundreds of rows in a few hundred pixels: rows touch (a gap between them would alias into bands)
    # and a stall is at least a pixel wide (a 1 s stall in an hour is a third of one, and would vanish).
    half = 0.5 if total > 150 else 0.4
    pixel = data.window.seconds / 1000
    for cause, rows in by_cause.items():
        if cause == "streaming":
            add_bars(ax, rows, half, facecolors=STREAMING, linewidths=0)
        else:
            rows = {r: [(x, max(w, pixel)) for x, w in xs] for r, xs in rows.items()}
            add_bars(ax, rows, half, facecolors=CAUSE_COLORS.get(None if cause == "unknown" else cause),
                     edgecolors="white", linewidths=0.4 if data.window.seconds <= 120 and total <= 150 else 0.0)
    for rid, lo in open_stalls(data):
        if rid in mapping:
            ax.broken_barh([((lo - t0) / 1e9, data.window.seconds - (lo - t0) / 1e9)], (mapping[rid] - 0.4, 0.8),
                           facecolors="none", edgecolors=STILL_OPEN, hatch="xxx", linewidth=0.5)
    time_axis(ax, data.window.seconds)
    ax.set_ylim(max(total, 1) - 0.5, -0.5)  # no stream at all: one empty row, not a zero-height axis
    if total > steady_rows:
        ax.axhline(steady_rows - 0.5, color=MUTED, linewidth=0.6)
    ticks = list(range(0, steady_rows, max(1, steady_rows // 8)))
    labels = [str(t) for t in ticks]
    injected_rows = total - steady_rows
    if injected_rows <= 3:
        ticks += list(range(steady_rows, total))
        labels += ["injected"] * injected_rows
    else:  # one label for the block: per-row labels would print over each other
        ticks.append(steady_rows + (injected_rows - 1) // 2)
        labels.append(f"injected ({injected_rows})")
    ax.set_yticks(ticks, labels, fontsize=7 if compact else 8)
    ax.set_ylabel("stream")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


STILL_OPEN = "#333333"  # hatched over the stall's own colour, whatever its cause


def open_stalls(data: RunData) -> list[tuple[str, int]]:
    """Stalls still open when the window closed: (request_id, start ns). The analysis
    counts them up to the window's end (a lower bound; `censored`); the hatching marks them as still open
    there, a frozen stream that never sent another token among them."""
    if data.stalls is None or data.stalls.is_empty() or "censored" not in data.stalls.columns:
        return []
    shut = data.stalls.filter(pl.col("censored").fill_null(False))
    return [(rid, lo) for rid, lo in shut.select("request_id", "t_prev_ns").iter_rows()]


def span_groups(spans: list[InjectedSpan], min_gap_s: float) -> list[list[InjectedSpan]]:
    """Injected spans that overlap (or nearly: closer than min_gap_s) share one annotation."""
    groups: list[list[InjectedSpan]] = []
    for span in sorted(spans, key=lambda s: s.start_s):
        if groups and span.start_s < max(s.end_s for s in groups[-1]) + min_gap_s:
            groups[-1].append(span)
        else:
            groups.append([span])
    return groups


def span_verdicts(data: RunData, groups: list[list[InjectedSpan]]) -> list[str]:
    """What the stalls overlapping each group of injected spans did, in words."""
    out = []
    st = data.stalls
    streams = max(1, layout(data)[1])
    for group in groups:
        lo = data.t0_ns + int(min(s.start_s for s in group) * 1e9)
        hi = data.t0_ns + int(max(s.end_s for s in group) * 1e9)
        name = group[0].request_id + (f" +{len(group) - 1}" if len(group) > 1 else "")
        hit = st.filter((pl.col("t_prev_ns") < hi) & (pl.col("t_ns") > lo))
        if hit.is_empty():
            out.append(f"{name}: no stream stalled during its prefill")
            continue
        victims = hit["request_id"].n_unique()
        share = "every stream" if victims >= streams else f"{victims} of {streams} streams"
        out.append(f"{name}: {share} froze, worst gap {fmt_s(hit['gap_s'].max())}")  # type: ignore[arg-type]
    return out


def stall_picture(data: RunData) -> Figure:
    """Rows of streams over time with stalls coloured by cause, and every gap's size below."""
    spans = injected_spans(data)
    _, steady_rows, total = layout(data)
    rows_h = min(5.5, max(1.6, 0.14 * total + 0.6))
    fig = new_figure(rows_h + 2.9)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[rows_h, 2.3])
    draw_rows(top, data, spans)
    if data.stalls.is_empty():
        title = "No stalls: every gap stayed under its stall threshold"
    else:
        worst = data.stalls["gap_s"].max()
        title = (f"Where streams froze: {data.stalls.height:,} stalled gaps in "
                 f"{data.stalls['request_id'].n_unique():,} requests, worst {fmt_s(worst)}")  # type: ignore[arg-type]
    top.set_title(title, fontsize=11, loc="left", pad=18 if spans else 6)
    median = _gap_panel(bottom, data, spans)
    handles: list[Artist] = [Patch(color=STREAMING, label="tokens arriving"),
               Patch(color=WAITING, label="request sent, waiting for its first token")]
    causes = data.stalls["cause"].unique().to_list() if data.stalls.height else []
    handles += [Patch(color=CAUSE_COLORS.get(c), label=f"stalled: {CAUSE_NAMES.get(c, c)}") for c in causes]
    if open_stalls(data):
        handles.append(Patch(facecolor="white", edgecolor=STILL_OPEN, hatch="xxx",
                             label="still stalled when the window closed (counted to its end)"))
    if spans:
        src = "engine steps" if any(s.steps for s in spans) else "client send → first token"
        handles.append(Patch(color=INJECTED_SPAN, alpha=0.35, label=f"injected prompt's prefill ({src})"))
    if median is not None:
        handles.append(median)
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles) if len(handles) <= 4 else 3, fontsize=8, frameon=False)
    lifted = _span_labels(fig, top, data, spans)
    if lifted:  # a label lifted over its neighbour's: the title makes room above both
        top.set_title(title, fontsize=11, loc="left", pad=18 + lifted)
    return fig


def _span_labels(fig: Figure, ax: Axes, data: RunData, spans: list[InjectedSpan]) -> float:
    """Each group of injected prefills' verdict above the rows, from where it began, kept within the axes' width
    (a prefill late in the window would run its label past the figure's edge) and out of the layout (which
    would otherwise shrink every row to make room for it); returns how far a label was lifted over another."""
    groups = span_groups(spans, 0.25 * data.window.seconds)
    labels = [ax.annotate(verdict, xy=(max(0.0, group[0].start_s), -0.5), xytext=(0, 4), textcoords="offset points",
                          fontsize=9, fontweight="bold", color="#7a3a00", annotation_clip=False, va="bottom")
              for group, verdict in zip(groups, span_verdicts(data, groups), strict=True)]
    for label in labels:
        label.set_in_layout(False)  # the title's pad keeps their room
    return fit_labels(fig, ax, labels) if labels else 0.0


def _gap_panel(ax: Axes, data: RunData, spans: list[InjectedSpan]) -> Line2D | None:
    """Steady gaps' sizes at their arrival (a background sample: every one in a run of up to
    SAMPLE_POINTS gaps); every stall on top, in its cause's colour. Returns the median's line, for the legend."""
    t0 = data.t0_ns
    steady = data.chunks.sample if data.chunks.sample is not None else pl.DataFrame(
        schema={"t_ns": pl.Int64, "gap_s": pl.Float64})
    for span in spans:
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.18, linewidth=0, zorder=0)
    if steady.height:
        ax.scatter(((steady["t_ns"] - t0) / 1e9).to_numpy(), steady["gap_s"].to_numpy(), s=2, color=MUTED,
                   alpha=0.5, linewidths=0, rasterized=True)
    for cause in data.stalls["cause"].unique().to_list() if data.stalls.height else []:
        part = data.stalls.filter(pl.col("cause") == cause) if cause is not None \
            else data.stalls.filter(pl.col("cause").is_null())
        color = CAUSE_COLORS.get(cause)
        ax.hlines(part["gap_s"].to_numpy(), ((part["t_prev_ns"] - t0) / 1e9).to_numpy(),
                  ((part["t_ns"] - t0) / 1e9).to_numpy(), colors=color, linewidth=1.2, zorder=3)
        ax.scatter(((part["t_ns"] - t0) / 1e9).to_numpy(), part["gap_s"].to_numpy(), s=9,
                   color=color, linewidths=0, zorder=3)
    med = data.chunks.quantiles.get("itl_s", {}).get("p50")
    median = None
    if med is not None:
        if med > 0:  # named in the legend: a label on the line sat among the gaps drawn around it, unreadable
            median = ax.axhline(med, color="#555555", linestyle=":", linewidth=0.8, label=f"median gap {fmt_s(med)}")
        else:  # most tokens came in one read with the one before: 0 has no place on a log axis
            ax.text(0.002, 0.02, " median gap 0 (most tokens arrived with the one before), below the axis",
                    transform=ax.transAxes, fontsize=7, va="bottom", color="#555555")
        seconds_log_yaxis(ax)  # ticks as durations ("5 ms"), not 5 × 10⁻³
    ax.set_ylabel("gap before each token")
    ax.set_xlabel("seconds since measurement start")
    tidy(ax)
    return median
