"""One run's figures, one idea each: stalls, engine steps, TTFT, ITL, split, throughput, goodput.

`run_figures` returns them in reading order with a title and a one-sentence caption; a figure whose
data the run lacks is replaced by a note saying why (an external engine has no step log; a run with
no injected prompt has nothing to zoom on), never by an empty image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.report.data import RunData
from itlbench.report.inferred import InferredView, inferred_view
from itlbench.report.style import (
    DECODE,
    GOOD,
    INJECTED_SPAN,
    MISSED,
    MUTED,
    PREFILL,
    STREAMING,
    fmt_s,
    fmt_tokens,
    gap_cdf_axes,
    new_figure,
    tidy,
)
from itlbench.report.timeline import InjectedSpan, injected_spans, stall_picture


@dataclass
class FigureSpec:
    """A figure (or, when the run cannot draw it, a note) with its file stem, title and caption."""

    key: str
    title: str
    caption: str
    figure: Figure | None = None
    note: str | None = None
    inferred: bool = False  # drawn from steps inferred from the client's stamps, not from a step log


def _steps_s(data: RunData, whole_run: bool = False, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Steps in the window (or all of them) with seconds since measure start and durations."""
    t0 = data.t0_ns
    steps = data.steps if steps is None else steps
    steps = steps if whole_run else steps.filter((pl.col("end_ns") > t0) & (pl.col("start_ns") < data.window.end_ns))
    return (steps
            .with_columns(((pl.col("start_ns") - t0) / 1e9).alias("t_s"),
                          ((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("dur_s"),
                          pl.col("prefill_tokens").fill_null(0), pl.col("decode_tokens").fill_null(0))
            .sort("start_ns"))


def _zoom(data: RunData, spans: list[InjectedSpan]) -> tuple[float, float, str]:
    """Around the first injected prefill (with margins), else the whole window."""
    if spans:
        s = spans[0]
        pad = max(1.0, 0.15 * (s.end_s - s.start_s))
        lo, hi = max(0.0, s.start_s - pad), s.end_s + pad  # the whole prefill, even past the window
        more = f" (first of {len(spans)} injected prompts)" if len(spans) > 1 else ""
        return lo, hi, f"around {s.request_id}'s prefill{more}"
    return 0.0, data.window.seconds, "the whole measured window"


INFERRED_CAPTION = ("Inferred, not logged: {engine} publishes no step log, so each step is reconstructed from the "
                    "client's kernel receive stamps (one cluster of chunks across streams per step; a step's width "
                    "is its spacing, step plus hand-off) and its prefill tokens are estimated from "
                    "usage.prompt_tokens.{cut}")


def inferred_for(data: RunData) -> InferredView | None:
    """The inferred steps of a run without a step log, over the engine-steps figure's span (computed once)."""
    if "view" not in data.inferred_cache:
        lo, hi, _ = _zoom(data, injected_spans(data, whole_run=True))
        data.inferred_cache["view"] = inferred_view(data, lo, hi)
    return data.inferred_cache["view"]  # type: ignore[no-any-return]


def engine_steps_figure(data: RunData) -> FigureSpec:
    caption = ("Each bar is one engine step, as wide as it took, its tokens stacked: all red is a prefill step, "
               "red on blue a mixed step, blue a decode step; the token budget is dashed and the black line "
               "is each step's duration.")
    spec = FigureSpec("engine_steps", "The engine's steps", caption)
    steps = _steps_s(data, whole_run=True)
    view = None
    if steps.is_empty():
        view = inferred_for(data)
        if view is None or view.steps.is_empty():
            return _engine_metrics(data, spec)
        steps = _steps_s(data, whole_run=True, steps=view.steps)
        cut = (f" Only the first {(view.hi_ns - view.lo_ns) / 1e9:.1f} s of the span are drawn (the run is large)."
               if view.cut else "")
        spec.title, spec.inferred = "The engine's steps (inferred from the client's stamps)", True
        spec.caption = caption.replace("; the token budget is dashed", "") + " " + \
            INFERRED_CAPTION.format(engine=data.engine.name, cut=cut)
    spans = injected_spans(data, whole_run=True)
    lo, hi, where = _zoom(data, spans)
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
    if hi > data.window.seconds:
        ax.axvline(data.window.seconds, color="#555555", linestyle=":", linewidth=1)
        ax.text(data.window.seconds, 0.5, " end of the measured window", rotation=90, fontsize=8,
                transform=ax.get_xaxis_transform(), va="center")
    budgets = s["token_budget"].drop_nulls() if "token_budget" in s.columns else None
    if budgets is None:
        pass  # inferred steps: the client cannot see the engine's budget
    elif budgets.len():
        b = int(budgets.max())  # type: ignore[arg-type]
        ax.axhline(b, color="black", linestyle="--", linewidth=1)
        ax.text(lo, b, f" token budget {b:,}", va="bottom", fontsize=8)
    else:
        ax.text(0.01, 0.97, "unchunked: no token budget (a prompt is prefilled in one step)",
                transform=ax.transAxes, fontsize=8, va="top")
    for span in spans:
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.12, linewidth=0, zorder=0)
    ax.set_xlim(lo, hi)
    ax.set_ylabel("tokens in the step")
    ax.set_xlabel("seconds since measurement start")
    tidy(ax)
    ax2 = ax.twinx()
    ax2.hlines(w * 1e3, x, x + w, colors="black", linewidth=2.0, zorder=3)
    ax2.set_ylabel("step duration (ms)")
    ax2.set_ylim(bottom=0)
    ax2.spines["top"].set_visible(False)
    _annotate_chunks(ax2, data, s, spans)
    handles = [Patch(color=DECODE, label="decode tokens"), Patch(color=PREFILL, label="prefill tokens"),
               Line2D([], [], color="black", linewidth=2, label="step duration (right axis)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    kind = "Inferred engine steps" if view is not None else "Engine steps"
    ax.set_title(f"{kind} {where}: {s.height:,} steps, longest {fmt_s(float(w.max()) if len(w) else None)}",
                 fontsize=11, loc="left")
    spec.figure = fig
    return spec


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
    longest = mine.sort("dur_s").row(-1, named=True)
    for row, what in ((first, "first chunk"), (longest, "longest chunk")):
        ax.annotate(f"{what}: {fmt_tokens(row['prefill_tokens'])} tokens, {fmt_s(row['dur_s'])}",
                    xy=(row["t_s"] + row["dur_s"] / 2, row["dur_s"] * 1e3), xytext=(0, 12),
                    textcoords="offset points", ha="center", fontsize=8,
                    arrowprops={"arrowstyle": "-", "color": "#444444", "linewidth": 0.6})


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
    ax.set_xlim(0, data.window.seconds)
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


def ttft_figure(data: RunData) -> FigureSpec:
    caption = ("Left: every request's TTFT by prompt bucket (dots; injected prompts in orange), median as a "
               "bar; right: where the median TTFT went (client lag, server queue, prefill).")
    spec = FigureSpec("ttft", "Time to first token by prompt length", caption)
    t = data.ttft.filter(pl.col("ttft_s") > 0)
    present = [b for b in BUCKET_LABELS if t.filter(pl.col("bucket") == b).height]
    if not present:
        spec.note = "No request in the measured window received a first token."
        return spec
    fig = new_figure(3.6)
    left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
    rng = np.random.default_rng(0)
    for i, b in enumerate(present):
        rows = t.filter(pl.col("bucket") == b)
        for injected, color in ((False, STREAMING), (True, INJECTED_SPAN)):
            part = rows.filter(pl.col("injected") == injected)["ttft_s"].to_numpy()
            if len(part):
                left.scatter(i + rng.uniform(-0.25, 0.25, len(part)), part, s=8 if not injected else 30,
                             color=color, alpha=0.6 if not injected else 1, linewidths=0, zorder=3)
        med = float(rows["ttft_s"].median())  # type: ignore[arg-type]
        left.bar(i, med, width=0.7, color="#dddddd", zorder=1)
        left.text(i, med, f"{fmt_s(med)}\n(n={rows.height})", ha="center", va="bottom", fontsize=7)
    left.set_xticks(range(len(present)), present)
    left.set_yscale("log")
    left.set_ylabel("TTFT (s)")
    left.set_xlabel("prompt bucket (k = 1024 tokens)")
    tidy(left)
    _ttft_parts(right, t, present, data.engine.has_steps)
    spec.figure = fig
    return spec


def _ttft_parts(ax: Axes, t: pl.DataFrame, present: list[str], has_steps: bool) -> None:
    parts = (("client_lag_s", "client lag", MUTED), ("queue_s", "server queue", "#f2a900"),
             ("prefill_s", "prefill", PREFILL)) if has_steps else \
        (("client_lag_s", "client lag", MUTED), ("server_s", "server (queue + prefill; no step log)", PREFILL))
    for i, b in enumerate(present):
        rows = t.filter(pl.col("bucket") == b)
        meds = [max(0.0, float(rows[c].median() or 0.0)) for c, _, _ in parts]  # type: ignore[arg-type]
        total = sum(meds) or 1.0
        left = 0.0
        for (_, _, color), v in zip(parts, meds, strict=True):
            ax.barh(i, v / total, left=left, color=color, height=0.6)
            left += v / total
    ax.set_yticks(range(len(present)), present)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the median TTFT")
    ax.legend(handles=[Patch(color=c, label=n) for _, n, c in parts], fontsize=7, frameon=False,
              loc="lower right", bbox_to_anchor=(1, 1), ncols=len(parts))
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values)
    n = len(v)
    return v, (np.arange(1, n + 1) - 0.5) / n


def pooled_cdf(data: RunData) -> tuple[np.ndarray, np.ndarray, int]:
    """The steady streams' pooled gaps as (x, share ≤ x, samples): a fixed number of quantiles
    (analysis.scale.CDF_POINTS, each within 0.013 % of the exact one), whatever the run's size."""
    x, y = data.chunks.cdf
    return x, y, data.chunks.itl.count


def itl_figure(data: RunData) -> FigureSpec:
    caption = ("The share of gaps at or below each length (log x; the y axis stretches the tail so "
               "p99 and p99.9 are visible): pooled over every gap, and per request (its mean, TPOT).")
    spec = FigureSpec("itl_cdf", "Inter-token latency distribution", caption)
    x, y, n = pooled_cdf(data)
    if n < 2:
        spec.note = "Fewer than two inter-token gaps in the measured window."
        return spec
    fig = new_figure(3.8)
    ax = fig.subplots()
    ax.step(x, y, where="post", color=STREAMING, linewidth=1.6, label=f"pooled, every gap (n={n:,})")
    spans = data.chunks.spans
    per_req = (spans.filter(~pl.col("injected")).select(pl.col("mean_s").alias("m"), pl.col("max_s").alias("mx"))
               if spans is not None and spans.height else pl.DataFrame(schema={"m": pl.Float64, "mx": pl.Float64}))
    if per_req.height >= 2:
        xm, ym = _cdf(per_req["m"].to_numpy())
        ax.step(xm, ym, where="post", color=GOOD, linewidth=1.2, label=f"per request, mean gap (n={len(xm):,})")
        xx, yx = _cdf(per_req["mx"].to_numpy())
        ax.step(xx, yx, where="post", color=MISSED, linewidth=1.0, linestyle="--",
                label="per request, worst gap")
    itl = data.summary.get("itl_s") or {}
    for key, label in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9"), ("max", "max")):
        v = itl.get(key)
        if v:
            q = {"p50": 0.5, "p99": 0.99, "p999": 0.999, "max": 1 - 0.5 / n}[key]
            ax.plot([v], [q], marker="o", color="black", markersize=4, zorder=4)
            ax.annotate(f"{label} {fmt_s(v)}", (v, q), xytext=(5, -3), textcoords="offset points", fontsize=8)
    target = _itl_target(data)
    if target:
        ax.axvline(target[1], color="black", linestyle="--", linewidth=0.8)
        ax.text(target[1], 0.02, f" SLO {target[0]} {fmt_s(target[1])}", fontsize=8, rotation=90,
                va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    positive = x[x > 0]
    if len(positive):
        ax.set_xlim(left=max(float(positive[0]), float(np.quantile(positive, 0.01)) / 3))
    gap_cdf_axes(ax, max(0.5 / n, 0.005), 1 - min(0.5 / n, 0.001))
    spec.figure = fig
    return spec


def _itl_target(data: RunData) -> tuple[str, float] | None:
    slos = (data.summary.get("goodput") or {}).get("slos") or {}
    default = slos.get("default") or {}
    if default.get("itl_s"):
        return f"itl_{default.get('itl_stat', 'p99')}", float(default["itl_s"])
    return None


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
    steps = _steps_s(data)
    if steps.height:
        rows.append(("tokens", float(steps["prefill_tokens"].sum()), float(steps["decode_tokens"].sum()),
                     lambda v: f"{v:,.0f}"))
    fig = new_figure(0.9 + 0.55 * len(rows))
    ax = fig.subplots()
    for i, (_, a, b, fmt) in enumerate(rows):
        total = (a + b) or 1.0
        ax.barh(i, a / total, color=PREFILL, height=0.6)
        ax.barh(i, b / total, left=a / total, color=DECODE, height=0.6)
        for left, v, name in ((0.0, a, "prefill"), (a / total, b, "decode")):
            if v / total > 0.08:
                ax.text(left + v / total / 2, i, f"{name} {fmt(v)} ({v / total:.0%})", ha="center",
                        va="center", color="white", fontsize=9, fontweight="bold")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "25 %", "50 %", "75 %", "100 %"])
    ax.set_xlabel(f"share (time source: {split.get('source')})")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    spec.figure = fig
    return spec


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
    reqs, _ = np.histogram((done["done_ns"] - data.t0_ns).to_numpy() / 1e9, bins=edges)
    fig = new_figure(3.2)
    ax = fig.subplots()
    ax.bar(edges[:-1], toks, width=1.0, align="edge", color=DECODE, alpha=0.85, linewidth=0, zorder=2)
    mean = float((data.summary.get("throughput") or {}).get("output_tokens_per_s") or toks.mean())
    ax.axhline(mean, color="black", linestyle="--", linewidth=0.8)
    ax.text(0.002, mean, f" mean {mean:,.0f} output tokens/s", transform=ax.get_yaxis_transform(),
            fontsize=8, va="bottom")
    for span in injected_spans(data):
        ax.axvspan(span.start_s, span.end_s, color=INJECTED_SPAN, alpha=0.25, linewidth=0, zorder=0)
    ax.set_xlim(0, seconds)
    ax.set_ylabel("output tokens / s")
    ax.set_xlabel("seconds since measurement start")
    tidy(ax)
    ax2 = ax.twinx()
    ax2.step(edges[1:], np.cumsum(reqs), where="post", color=GOOD, linewidth=1.4)
    ax2.set_ylabel("requests completed (cumulative)", color=GOOD)
    ax2.set_ylim(bottom=0)
    ax2.spines["top"].set_visible(False)
    spec.figure = fig
    return spec


def goodput_figure(data: RunData) -> FigureSpec:
    caption = ("Per SLO class, the requests in the window that met every target (green) and why the others "
               "did not: TTFT over target, ITL over target, or the request failed.")
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
