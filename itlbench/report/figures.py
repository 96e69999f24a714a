"""One run's figures, one idea each: stalls, engine steps, TTFT, ITL, split, throughput, goodput.

`run_figures` returns them in reading order with a title and a one-sentence caption; a figure whose
data the run lacks is replaced by a note saying why (an external engine has no step log; a run with
no injected prompt has nothing to zoom on), never by an empty image.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Patch

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.report.data import RunData
from itlbench.report.figure_spec import FigureSpec, inferred_for, steps_s
from itlbench.report.slos import itl_target, slo_text
from itlbench.report.steps_figure import engine_steps_figure
from itlbench.report.style import (
    DECODE,
    GOOD,
    INJECTED_SPAN,
    MISSED,
    MUTED,
    PREFILL,
    STREAMING,
    fmt_s,
    gap_cdf_axes,
    new_figure,
    seconds_log_xaxis,
    seconds_yaxis,
    tidy,
    time_axis,
)
from itlbench.report.timeline import injected_spans, stall_picture
from itlbench.report.ttft_parts import ttft_parts as _ttft_parts


def ttft_figure(data: RunData) -> FigureSpec:
    caption = ("Left: every request's TTFT by prompt bucket (dots; injected prompts in orange), the median {median} "
               "and written under the bucket (p50) with its count; right: where the TTFT went ({parts}) per bucket, "
               "for its median (each part's median over the bucket; none for one request) and for its slowest 10 % "
               "(each part's median over its ⌈n/10⌉ longest TTFTs, the least of which the label gives; none under 10 "
               "requests, as for a p90){tail}.")
    spec = FigureSpec("ttft", "Time to first token by prompt length", caption)
    t = data.ttft.filter(pl.col("ttft_s") > 0)
    present = [b for b in BUCKET_LABELS if t.filter(pl.col("bucket") == b).height]
    if not present:
        spec.note = "No request in the measured window received a first token."
        return spec
    fig = new_figure(3.6)
    left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
    logged = seconds_yaxis(left, t["ttft_s"].to_list())  # before the bars, which start at zero on a linear axis
    rng = np.random.default_rng(0)
    ticks: list[str] = []
    for i, b in enumerate(present):
        rows = t.filter(pl.col("bucket") == b)
        for injected, color in ((False, STREAMING), (True, INJECTED_SPAN)):
            part = rows.filter(pl.col("injected") == injected)["ttft_s"].to_numpy()
            if len(part):
                left.scatter(i + rng.uniform(-0.25, 0.25, len(part)), part, s=8 if not injected else 30,
                             color=color, alpha=0.6 if not injected else 1, linewidths=0, zorder=3)
        med = ((data.summary.get("ttft_s") or {}).get(b) or {}).get("p50")  # as the table has it: — for one request
        if med is not None:
            _median_mark(left, i, float(med), logged)
        ticks.append(f"{b}\np50 {fmt_s(med)}\nn={rows.height:,}")  # under the bucket: over it, the dots hid it
    left.set_xticks(range(len(present)), ticks, fontsize=8)
    left.set_xlim(-0.5, len(present) - 0.5)  # each bucket a full slot: a one-dot bucket at the edge kept only a sliver
    steps = data.engine.has_steps  # without a step log the server's part is not split into queue and prefill
    spec.caption = caption.format(median="as a line across the bucket (a log axis: the TTFTs span decades, and a "
                                         "bar has no zero to start from)" if logged else "as a bar from zero",
                                  parts="client lag, server queue, prefill" if steps else
                                  "client lag, and the server's queue and prefill together: no step log splits them",
                                  tail=": a full batch leaves the median prefilling and the tail queueing" if steps
                                  else "")
    left.set_ylabel("TTFT" + (" (log)" if logged else ""))
    left.set_xlabel("prompt bucket (k = 1024 tokens)")
    tidy(left)
    _ttft_parts(right, t, present, steps)
    spec.figure = fig
    return spec


def _median_mark(ax: Axes, i: int, med: float, logged: bool) -> None:
    """A bucket's median: a bar from zero on a linear axis; on a log one a line across the bucket, since a bar
    would start at the axis' arbitrary floor and its length would compare nothing."""
    if logged:
        ax.hlines(med, i - 0.35, i + 0.35, color="#555555", linewidth=2.5, zorder=2)
    else:
        ax.bar(i, med, width=0.7, color="#dddddd", zorder=1)


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values)
    n = len(v)
    return v, (np.arange(1, n + 1) - 0.5) / n


def pooled_cdf(data: RunData) -> tuple[np.ndarray, np.ndarray, int]:
    """The steady streams' pooled gaps as (x, share ≤ x, samples): a fixed number of quantiles
    (analysis.scale.CDF_POINTS, each within 0.013 % of the exact one), whatever the run's size."""
    x, y = data.chunks.cdf
    return x, y, data.chunks.itl.count


SLO_REACH = 3.0  # an ITL target beyond this many times the longest gap drawn is marked at the axis' edge


def itl_figure(data: RunData) -> FigureSpec:
    caption = ("The share of gaps at or below each length (log x; the y axis stretches the tail so "
               "p99 and p99.9 are visible): pooled over every gap; per request its TPOT (mean gap) over the "
               "steady requests sent in the window, as the table below counts them; and per request its worst "
               "gap in the window, over every steady request with a gap there (those still in flight when it "
               "opened too).")
    spec = FigureSpec("itl_cdf", "Inter-token latency distribution", caption)
    x, y, n = pooled_cdf(data)
    if n < 2:
        spec.note = "Fewer than two inter-token gaps in the measured window."
        return spec
    fig = new_figure(3.8)
    ax = fig.subplots()
    ax.step(x, y, where="post", color=STREAMING, linewidth=1.6, label=f"pooled, every gap (n={n:,})")
    drawn = [float(x.max())]
    tpot = data.chunks.tpot
    means = (tpot.filter(~pl.col("injected"))["tpot_s"].drop_nulls().to_numpy()
             if tpot is not None and tpot.height else np.array([]))
    if len(means) >= 2:  # the table's TPOT row, request for request
        xm, ym = _cdf(means)
        ax.step(xm, ym, where="post", color=GOOD, linewidth=1.2, label=f"per request, TPOT (mean gap; n={len(xm):,})")
        drawn.append(float(xm.max()))
    spans = data.chunks.spans
    worst = (spans.filter(~pl.col("injected"))["max_s"].drop_nulls().to_numpy()
             if spans is not None and spans.height else np.array([]))
    if len(worst) >= 2:
        xx, yx = _cdf(worst)
        ax.step(xx, yx, where="post", color=MISSED, linewidth=1.0, linestyle="--",
                label=f"per request, worst gap in the window (n={len(xx):,})")
        drawn.append(float(xx.max()))
    itl = data.summary.get("itl_s") or {}
    for key, label in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9"), ("max", "max")):
        v = itl.get(key)
        if v:
            q = {"p50": 0.5, "p99": 0.99, "p999": 0.999, "max": 1 - 0.5 / n}[key]
            ax.plot([v], [q], marker="o", color="black", markersize=4, zorder=4)
            ax.annotate(f"{label} {fmt_s(v)}", (v, q), xytext=(5, -3), textcoords="offset points", fontsize=8)
            drawn.append(float(v))
    seconds_log_xaxis(ax)
    positive = x[x > 0]
    if len(positive) and max(drawn) > 0:
        lo, hi = max(float(positive[0]), float(np.quantile(positive, 0.01))) / 1.5, max(drawn) * 1.6
        hi = _slo_line(ax, data, lo, hi)
        ax.set_xlim(lo, hi)
    gap_cdf_axes(ax, max(0.5 / n, 0.005), 1 - min(0.25 / n, 0.001))  # above the max's 1 - 0.5/n: not cut in half
    spec.figure = fig
    return spec


def _slo_line(ax: Axes, data: RunData, lo: float, hi: float) -> float:
    """The ITL target as a dashed line where it sits near the gaps drawn (returns the x limit that shows it); far
    from them (a 200 ms default against 2 ms gaps) a label at the axis' edge with its value and an arrow, so
    the target does not squash the data against the other edge."""
    target = itl_target(data.summary)
    if target is None:
        return hi
    name, value, default = target
    # the target is each request's own (goodput's), not the pooled curve's: a p99 line on the pooled CDF read as one
    what = {"itl_p99": "each request's ITL p99", "itl_max": "each request's worst gap"}.get(name, name)
    label = f"SLO: {what} ≤ {fmt_s(value)}" + (" (default)" if default else "")
    if lo <= value <= hi / 1.6 * SLO_REACH:  # named in the legend: a label along the line crossed the curves
        ax.axvline(value, color="black", linestyle="--", linewidth=0.8, label=label)
        return max(hi, value * 1.3)
    right = value > hi
    ax.annotate(f"{label}, off the scale →" if right else f"← {label}, off the scale",
                xy=(0.995 if right else 0.005, 0.04), xycoords="axes fraction", ha="right" if right else "left",
                va="bottom", fontsize=8, bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#999999", "lw": 0.6})
    return hi


def split_figure(data: RunData) -> FigureSpec:
    caption = ("Engine time in prefill vs decode over the measured window (mixed steps apportioned by a cost "
               "model fitted on the run's own steps), beside the tokens each phase processed.")
    spec = FigureSpec("split", "Prefill : decode split", caption)
    split = data.summary.get("split") or {}
    p, d = split.get("prefill_s"), split.get("decode_s")
    inferred = False
    if (p is None or d is None) and data.steps.is_empty() and (view := inferred_for(data)) is not None:
        if view.split is None:
            spec.note = f"No prefill:decode split: {view.split_note}."
            return spec
        split, inferred = view.split, True
        p, d = split.get("prefill_s"), split.get("decode_s")
        spec.title, spec.inferred = "Prefill : decode split (estimated from inferred steps)", True
        spec.caption = ("Estimated, not measured: engine time in prefill vs decode over the measured window from the "
                        f"steps inferred from the client's stamps ({data.engine.name} publishes no step log and no "
                        "prefill/decode counters itlbench reads): a prefill step counts whole, a mixed one by its "
                        "spacing beyond the decode cadence, the rest as decode.")
    if p is None or d is None or (p + d) <= 0:
        spec.note = f"No prefill:decode split: {split.get('source', 'unavailable')} ({data.engine.source})."
        return spec
    rows = [("engine time" if not inferred else "inferred engine time", p, d, fmt_s)]
    steps = steps_s(data)
    if steps.height:
        rows.append(("tokens", float(steps["prefill_tokens"].sum()), float(steps["decode_tokens"].sum()),
                     lambda v: f"{v:,.0f}"))
    fig = new_figure(0.9 + 0.55 * len(rows))
    ax = fig.subplots()
    for i, (_, a, b, _) in enumerate(rows):
        total = (a + b) or 1.0
        ax.barh(i, a / total, color=PREFILL, height=0.6)
        ax.barh(i, b / total, left=a / total, color=DECODE, height=0.6)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "25 %", "50 %", "75 %", "100 %"])
    ax.set_xlabel(f"share (time source: {split.get('source')})")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.draw_without_rendering()  # settle the layout: the labels are placed by their drawn widths
    for i, (_, a, b, fmt) in enumerate(rows):
        total = (a + b) or 1.0
        _split_labels(ax, i, [("prefill", a, fmt(a), 0.0), ("decode", b, fmt(b), a / total)], total)
    spec.figure = fig
    return spec


def _split_labels(ax: Axes, row: int, parts: list[tuple[str, float, str, float]], total: float) -> None:
    """Each part's label inside its segment, centred where it fits; else from the segment's own edge into the
    other one (a thin prefill's label starts at the bar's left end, never over the axis' row labels), and
    outside the bar on its right where even that would run past the other part's label."""
    renderer = FigureCanvasAgg(ax.figure).get_renderer()  # type: ignore[arg-type]  # what savefig draws with
    axes_px = ax.get_window_extent(renderer).width
    texts = [(f"{name} {shown} ({v / total:.0%})", v / total, left) for name, v, shown, left in parts if v > 0]
    widths = []
    for text, *_ in texts:
        probe = ax.text(0, row, text, fontsize=9, fontweight="bold")
        widths.append(probe.get_window_extent(renderer).width / axes_px + 0.02)  # in axes fractions, with a margin
        probe.remove()
    placed: list[tuple[float, float]] = []  # the spans taken so far, in axes fractions
    for k, ((text, share, left), width) in enumerate(zip(texts, widths, strict=True)):
        first = k == 0 and left == 0.0
        if width <= share:
            x, ha, span = left + share / 2, "center", (left + share / 2 - width / 2, left + share / 2 + width / 2)
        elif first:
            x, ha, span = 0.01, "left", (0.01, 0.01 + width)
        else:
            x, ha, span = left + share - 0.01, "right", (left + share - 0.01 - width, left + share - 0.01)
        if any(span[0] < b and a < span[1] for a, b in placed):  # would overlap: beside the bar instead
            ax.text(1.01, row, text, ha="left", va="center", fontsize=8, color="#333333",
                    transform=ax.get_yaxis_transform())
            continue
        placed.append(span)
        ax.text(x, row, text, ha=ha, va="center", color="white", fontsize=9, fontweight="bold")


def throughput_figure(data: RunData) -> FigureSpec:
    caption = ("Output tokens the client received per second (1 s bins) and the requests completed so far "
               "(green); the injected prompt's prefill is shaded.")
    spec = FigureSpec("throughput", "Throughput over time", caption)
    seconds = data.window.seconds
    toks = data.chunks.token_bins  # output tokens per 1 s bin from measure start (analysis.scale)
    if not toks.size or not toks.sum() or seconds <= 0:
        spec.note = "No tokens arrived in the measured window."
        return spec
    nbins = max(1, int(np.ceil(seconds)))
    edges = np.arange(nbins + 1, dtype=float)
    toks = np.resize(toks, nbins) if toks.size != nbins else toks
    done = data.tables["requests"].filter(pl.col("status") == "ok").drop_nulls("done_ns")
    at = np.sort((done["done_ns"] - data.t0_ns).to_numpy() / 1e9)
    at = at[(at >= 0) & (at < seconds)]  # a step at each completion: per-bin counts drawn at bin ends lagged 1 s
    fig = new_figure(3.2)
    ax = fig.subplots()
    ax.bar(edges[:-1], toks, width=1.0, align="edge", color=DECODE, alpha=0.85, linewidth=0, zorder=2)
    mean = float((data.summary.get("throughput") or {}).get("output_tokens_per_s") or toks.mean())
    # named in the legend: a label on the line sat among the bars' tops, which reach it in every steady second
    mean_line = ax.axhline(mean, color="black", linestyle="--", linewidth=0.8,
                           label=f"mean {mean:,.0f} output tokens/s")
    for span in injected_spans(data):
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.25, linewidth=0, zorder=0)
    time_axis(ax, seconds)
    ax.set_ylabel("output tokens / s")
    ax.set_xlabel("seconds since measurement start")
    tidy(ax)
    ax2 = ax.twinx()
    (done_line,) = ax2.step(np.r_[0.0, at, seconds], np.r_[0, np.arange(1, len(at) + 1), len(at)], where="post",
                            color=GOOD, linewidth=1.4,
                            label="requests completed (cumulative, right axis)")
    ax2.set_ylabel("requests completed (cumulative)", color=GOOD)
    ax2.set_ylim(bottom=0)
    ax2.spines["top"].set_visible(False)
    fig.legend(handles=[Patch(color=DECODE, alpha=0.85, label="output tokens per second"), mean_line, done_line],
               loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    spec.figure = fig
    return spec


def goodput_figure(data: RunData) -> FigureSpec:
    caption = ("Per SLO class, the requests in the window that met every target (green) and why the others "
               "did not: TTFT over target, ITL over target, or the request failed.")
    if (slos := slo_text(data.summary)) is not None:
        caption += f" Judged against {slos}."
    spec = FigureSpec("goodput", "Goodput per class", caption)
    j = data.judged
    if j.is_empty():
        spec.note = "No request was scheduled in the measured window."
        return spec
    rows = (j.with_columns(pl.col("cls").fill_null("?"),
                           (pl.col("status") != "ok").fill_null(True).alias("failed"))
            .group_by("cls").agg(pl.col("good").sum().alias("good"),
                                 (~pl.col("good") & ~pl.col("failed") & ~pl.col("ttft_ok")).sum().alias("ttft"),
                                 (~pl.col("good") & ~pl.col("failed") & pl.col("ttft_ok") & ~pl.col("itl_ok"))
                                 .sum().alias("itl"),
                                 pl.col("failed").sum().alias("failed"), pl.len().alias("n"))
            .sort("cls"))
    fig = new_figure(0.9 + 0.45 * rows.height)
    ax = fig.subplots()
    parts = (("good", "met every SLO", GOOD), ("ttft", "TTFT over target", "#f2a900"),
             ("itl", "ITL over target", MISSED), ("failed", "failed (error, timeout)", MUTED))
    seconds = data.window.seconds or 1.0
    for i, r in enumerate(rows.iter_rows(named=True)):
        left = 0
        for key, _, color in parts:
            ax.barh(i, r[key], left=left, color=color, height=0.6)
            left += r[key]
        ax.text(left, i, f"  {r['good']}/{r['n']} good, {r['good'] / seconds:.2f} req/s", va="center", fontsize=8)
    ax.set_yticks(range(rows.height), rows["cls"].to_list())
    ax.invert_yaxis()
    ax.set_xlabel("requests scheduled in the measured window")
    ax.set_xlim(0, rows["n"].max() * 1.35)  # type: ignore[operator]
    ax.legend(handles=[Patch(color=c, label=n) for _, n, c in parts], fontsize=7, frameon=False, ncols=4,
              loc="lower left", bbox_to_anchor=(0, 1))
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    spec.figure = fig
    return spec


def run_figures(data: RunData) -> list[FigureSpec]:
    stall_caption = ("One row per steady stream: blue while its tokens arrive at their usual pace, coloured "
                     "by cause where a gap was a stall; shaded where the injected prompt was prefilled; "
                     "below, every gap's size.")
    return [FigureSpec("stalls", "The stall picture", stall_caption, stall_picture(data)),
            engine_steps_figure(data), ttft_figure(data), itl_figure(data), throughput_figure(data),
            split_figure(data), goodput_figure(data)]
