"""The engine-steps figure: each step as wide as it took with its tokens stacked, zoomed on the first
injected prefill; for an external engine, its steps inferred from the client's stamps, else its own
token counters between /metrics scrapes."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from itlbench.report.data import RunData
from itlbench.report.figure_spec import INFERRED_CAPTION, FigureSpec, inferred_for, steps_s, zoom
from itlbench.report.style import (
    DECODE,
    INJECTED_SPAN,
    PREFILL,
    fit_labels,
    fmt_s,
    fmt_tokens,
    new_figure,
    tidy,
    time_axis,
)
from itlbench.report.timeline import InjectedSpan, injected_spans


def engine_steps_figure(data: RunData) -> FigureSpec:
    caption = ("Each bar is one engine step, as wide as it took, its tokens stacked: all red is a prefill step, "
               "red on blue a mixed step, blue a decode step; the token budget is dashed and the black line "
               "is each step's duration.")
    spec = FigureSpec("engine_steps", "The engine's steps", caption)
    steps = steps_s(data, whole_run=True)
    view = None
    if steps.is_empty():
        view = inferred_for(data)
        if view is None or view.steps.is_empty():
            return _engine_metrics(data, spec)
        steps = steps_s(data, whole_run=True, steps=view.steps)
        cut = (f" Only the first {(view.hi_ns - view.lo_ns) / 1e9:.1f} s of the span are drawn (the run is large)."
               if view.cut else "")
        spec.title, spec.inferred = "The engine's steps (inferred from the client's stamps)", True
        spec.caption = caption.replace("; the token budget is dashed", "") + " " + \
            INFERRED_CAPTION.format(engine=data.engine.name, cut=cut)
    spans = injected_spans(data, whole_run=True)
    lo, hi, where = zoom(data, spans)
    if view is not None and view.cut:
        hi = min(hi, (view.hi_ns - data.t0_ns) / 1e9)
    s = steps.filter((pl.col("t_s") + pl.col("dur_s") > lo) & (pl.col("t_s") < hi))
    fig = new_figure(4.6)
    ax = fig.subplots()
    x, w = s["t_s"].to_numpy(), s["dur_s"].to_numpy()
    p, d = s["prefill_tokens"].to_numpy(), s["decode_tokens"].to_numpy()
    ax.add_collection(_bars(x, w, np.zeros_like(d), d, DECODE, "none", 0.0))
    ax.add_collection(_bars(x, w, d, d + p, PREFILL, "white", np.where(p > 0, 0.5, 0.0)))
    ax.autoscale_view()
    marks = _window_end(ax, data, hi) + _budget(ax, s)
    for span in spans:
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.12, linewidth=0, zorder=0)
    ax.set_xlim(lo, hi)
    ax.set_ylabel("tokens in the step")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))  # 32,768 as the labels write it
    ax.set_xlabel("seconds since measurement start")
    tidy(ax)
    ax2 = ax.twinx()
    ax2.hlines(w * 1e3, x, x + w, colors="black", linewidth=2.0, zorder=3)
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_s(v / 1e3)))  # drawn in ms, read as "4.81 s"
    ax2.set_ylabel("step duration")
    ax2.set_ylim(0, float(w.max()) * 1e3 * 1.3 if len(w) and w.max() > 0 else None)  # headroom for the labels
    ax2.spines["top"].set_visible(False)
    handles = [Patch(color=DECODE, label="decode tokens"), Patch(color=PREFILL, label="prefill tokens"),
               Line2D([], [], color="black", linewidth=2, label="step duration (right axis)"), *marks]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    kind = "Inferred engine steps" if view is not None else "Engine steps"
    ax.set_title(f"{kind} {where}: {s.height:,} steps, longest {fmt_s(float(w.max()) if len(w) else None)}",
                 fontsize=11, loc="left")
    _annotate_chunks(ax2, data, s, spans)
    spec.figure = fig
    return spec


def _window_end(ax: Axes, data: RunData, hi: float) -> list[Line2D]:
    """The window's end as a dotted line where the view passes it, named in the legend: a label on the line ran
    across the prefill bars it cuts through (a prefill that outlasts the window is the usual reason to see it)."""
    if hi <= data.window.seconds:
        return []
    return [ax.axvline(data.window.seconds, color="#555555", linestyle=":", linewidth=1,
                       label="end of the measured window")]


def _budget(ax: Axes, s: pl.DataFrame) -> list[Line2D]:
    """The token budget as a dashed line named in the legend (a label on it sat on the bars that fill it), or a
    legend entry saying there is none; nothing for inferred steps, whose budget the client cannot see."""
    budgets = s["token_budget"].drop_nulls() if "token_budget" in s.columns else None
    if budgets is None:
        return []
    if budgets.len():
        b = int(budgets.max())  # type: ignore[arg-type]
        return [ax.axhline(b, color="black", linestyle="--", linewidth=1, label=f"token budget {b:,}")]
    return [Line2D([], [], linestyle="none", label="unchunked: no token budget (a prompt is prefilled in one step)")]


def _bars(x: np.ndarray, w: np.ndarray, y0: np.ndarray, y1: np.ndarray, color: str, edge: str,
          linewidth: float | np.ndarray) -> PolyCollection:
    """Edge-aligned bars as one collection: thousands of steps as `ax.bar`'s Rectangles took seconds."""
    verts = np.stack([np.stack([x, y0], 1), np.stack([x + w, y0], 1), np.stack([x + w, y1], 1),
                      np.stack([x, y1], 1)], 1)
    bars = PolyCollection(verts, facecolors=color, edgecolors=edge, linewidths=linewidth)
    bars.sticky_edges.y.append(0.0)  # as ax.bar's: the axis starts at zero tokens
    return bars


def _annotate_chunks(ax: Axes, data: RunData, s: pl.DataFrame, spans: list[InjectedSpan]) -> None:
    """Label the first and the longest step that prefilled the first injected prompt."""
    if not spans or not spans[0].steps:
        return
    sid = data.tables["requests"].filter(pl.col("request_id") == spans[0].request_id)["server_request_id"][0]
    mine = s.filter(pl.col("prefill_request_ids").list.contains(sid))
    if mine.height < 2:
        return
    first = mine.row(0, named=True)
    longest = mine.row(int(mine["dur_s"].arg_max() or 0), named=True)  # the earliest of equals: the first, if it ties
    if (longest["t_s"], longest["dur_s"]) == (first["t_s"], first["dur_s"]):  # one chunk is both: said once, not two labels on one spot
        labels = [(first, "first and longest chunk", "center", 0)]
    else:  # the earlier label leans left and the later right, so two close chunks' labels do not cover each other
        early, late = sorted(((first, "first chunk"), (longest, "longest chunk")), key=lambda r: r[0]["t_s"])
        labels = [(early[0], early[1], *_early_lean(early[0]["t_s"], *ax.get_xlim())), (late[0], late[1], "left", 4)]
    texts = [ax.annotate(f"{what}: {fmt_tokens(row['prefill_tokens'])} tokens, {fmt_s(row['dur_s'])}",
                         xy=(row["t_s"] + row["dur_s"] / 2, row["dur_s"] * 1e3), xytext=(dx, 12),
                         textcoords="offset points", ha=ha, fontsize=8, zorder=5,
                         bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
                         arrowprops={"arrowstyle": "-", "color": "#444444", "linewidth": 0.6})
             for row, what, ha, dx in labels]
    fit_labels(ax.figure, ax, texts)  # type: ignore[arg-type]  # a last chunk near the right edge ran past it


def _early_lean(x: float, lo: float, hi: float) -> tuple[str, int]:
    """The earlier label leans left, unless its chunk is near the left edge: it would cover the tick labels."""
    return ("right", -4) if x - lo > 0.3 * (hi - lo) else ("left", 4)


def _engine_metrics(data: RunData, spec: FigureSpec) -> FigureSpec:
    """External engines: token rates and queue gauges from their own /metrics samples, if any."""
    m = data.tables["server_metrics"]
    rates = []
    for suffix, label, color in (("prompt_tokens_total", "prompt (prefill) tokens/s", PREFILL),
                                 ("generation_tokens_total", "generated (decode) tokens/s", DECODE)):
        series = (m.filter(pl.col("name").str.ends_with(suffix)).group_by("t_ns").agg(pl.col("value").sum())
                  .sort("t_ns"))
        if series.height >= 2:
            t = ((series["t_ns"] - data.t0_ns) / 1e9).to_numpy()
            v = series["value"].to_numpy()
            rates.append((t[1:], np.clip(np.diff(v) / np.diff(t), 0, None), label, color))
    if not rates:
        spec.note = (f"{data.engine.name} gave no step log and no token counters itlbench reads "
                     f"({data.engine.source}), so the engine's steps cannot be drawn; the client-side "
                     "figures below are all this run has.")
        return spec
    fig = new_figure(3.8)
    ax = fig.subplots()
    for t, r, label, color in rates:
        ax.step(t, r, where="pre", color=color, label=label)
    for span in injected_spans(data):
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.15, linewidth=0)
    time_axis(ax, data.window.seconds)
    ax.set_ylabel("tokens per second")
    ax.set_xlabel("seconds since measurement start")
    ax.legend(fontsize=8, frameon=False)
    tidy(ax)
    ax.set_title(f"{data.engine.name}'s own counters between /metrics scrapes (no per-step data: "
                 "this engine publishes no step log)", fontsize=10, loc="left")
    spec.caption = ("An external engine publishes no step log, so this shows the rate of its own token "
                    "counters between scrapes: prompt tokens (prefill) and generated tokens (decode).")
    spec.figure = fig
    return spec


