"""The figures of a comparison drawn from each run's own records: stall timelines on one axis, the longest gap in
progress over time, and the ITL distributions overlaid (`report.compare` lays them out beside its trade-off)."""

from __future__ import annotations

import numpy as np
import polars as pl

from itlbench.report.compare_ci import run_styles
from itlbench.report.data import RunData
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.style import fmt_s, gap_cdf_axes, new_figure, seconds_log_xaxis, seconds_log_yaxis, tidy
from itlbench.report.timeline import draw_rows, injected_spans


def _union_zoom(runs: list[RunData]) -> tuple[float, float] | None:
    spans = [s for r in runs for s in injected_spans(r)]
    if not spans:
        return None
    lo, hi = min(s.start_s for s in spans), max(s.end_s for s in spans)
    pad = max(1.0, 0.1 * (hi - lo))
    return max(0.0, lo - pad), min(hi + pad, max(r.window.seconds for r in runs))


def timelines_figure(runs: list[RunData], labels: list[str]) -> FigureSpec:
    zoom = _union_zoom(runs)
    where = "around the injected prefill" if zoom else "over the measured window"
    spec = FigureSpec("compare_stalls", "Stall timelines side by side",
                      f"Each run's streams {where}, on one time axis: blue while tokens arrive, red where a "
                      "prefill stalled them, shaded while the injected prompt was prefilled.")
    heights = [max(1.0, 0.09 * max(1, r.tables["requests"]["stream"].n_unique()) + 0.5) for r in runs]
    fig = new_figure(sum(heights) + 0.9)
    axes = fig.subplots(len(runs), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    for ax, run, label in zip(axes, runs, labels, strict=True):
        draw_rows(ax, run, injected_spans(run), compact=True)
        worst = (run.summary.get("itl_s") or {}).get("max")
        ax.set_title(f"{label}: worst gap {fmt_s(worst)}", fontsize=9, loc="left", pad=2)
        if zoom:
            ax.set_xlim(*zoom)
    axes[-1].set_xlabel("seconds since measurement start")
    spec.figure = fig
    return spec


def _worst_in_bins(lo: np.ndarray, hi: np.ndarray, gap: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per time bin, the longest gap in progress during it (a gap covers every bin from its start to its end)."""
    worst = np.full(len(edges) - 1, np.nan)
    a = np.clip(np.searchsorted(edges, lo, side="right") - 1, 0, len(edges) - 2)
    b = np.clip(np.searchsorted(edges, hi, side="right") - 1, 0, len(edges) - 2)
    inside = (hi >= edges[0]) & (lo <= edges[-1])
    a, b, gap = a[inside], b[inside], gap[inside]
    short = a == b
    np.fmax.at(worst, a[short], gap[short])
    for i, j, g in zip(a[~short], b[~short], gap[~short], strict=True):
        worst[i:j + 1] = np.fmax(worst[i:j + 1], g)
    return worst


def _drawn_gaps(run: RunData) -> pl.DataFrame:
    """Every stall and the background sample of ordinary steady gaps (analysis.scale): the worst gap in
    a bin is a stall's wherever one was, so the plateaus are exact and the floor between them sampled."""
    cols = ("t_prev_ns", "t_ns", "gap_s")
    frames = [f.select(cols) for f in (run.stalls, run.chunks.sample) if f is not None and f.height]
    return pl.concat(frames) if frames else pl.DataFrame(schema={c: pl.Int64 for c in cols[:2]} | {"gap_s": pl.Float64})


def gaps_figure(runs: list[RunData], labels: list[str], groups: list[str] | None = None) -> FigureSpec:
    zoom = _union_zoom(runs)
    spec = FigureSpec("compare_gaps", "How long the streams froze, over time",
                      "The longest gap any steady stream was in at each moment, one line per run (log y): a "
                      "plateau's height is how long the streams froze, its width how long it went on.")
    fig = new_figure(3.4)
    ax = fig.subplots()
    lo, hi = zoom or (0.0, max(r.window.seconds for r in runs))
    edges = np.linspace(lo, hi, 301)
    drawn = False
    for run, (color, label) in zip(runs, run_styles(labels, groups), strict=True):
        g = _drawn_gaps(run)
        if g.is_empty():
            continue
        worst = _worst_in_bins(((g["t_prev_ns"] - run.t0_ns) / 1e9).to_numpy(),
                               ((g["t_ns"] - run.t0_ns) / 1e9).to_numpy(), g["gap_s"].to_numpy(), edges)
        ax.step(edges[:-1], worst, where="post", color=color, linewidth=1.2, label=label)
        drawn = True
    if not drawn:
        spec.note = "No run has inter-token gaps to draw."
        return spec
    seconds_log_yaxis(ax)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("seconds since measurement start")
    ax.set_ylabel("longest gap in progress")
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    tidy(ax)
    spec.figure = fig
    return spec


def cdf_figure(runs: list[RunData], labels: list[str], groups: list[str] | None = None) -> FigureSpec:
    spec = FigureSpec("compare_itl_cdf", "ITL distributions overlaid",
                      "Pooled steady-stream gaps of every run (log x; the y axis stretches the tail): the "
                      "further left the tail, the smoother the streams.")
    fig = new_figure(4.0)
    ax = fig.subplots()
    n_min = None
    for run, (color, label) in zip(runs, run_styles(labels, groups), strict=True):
        gaps, y = run.chunks.cdf  # fixed quantiles of the pooled steady gaps
        n = run.chunks.itl.count
        if n < 2:
            continue
        ax.step(gaps, y, where="post", color=color, linewidth=1.4, label=label)
        n_min = n if n_min is None else min(n_min, n)
    if n_min is None:
        spec.note = "No run has inter-token gaps to compare."
        return spec
    seconds_log_xaxis(ax)
    gap_cdf_axes(ax, max(0.5 / n_min, 0.01), 1 - 0.5 / n_min)
    spec.figure = fig
    return spec
