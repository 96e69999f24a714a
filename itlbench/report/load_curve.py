"""Latency against load, for a sweep over `--rate` or `--streams` (and a capacity search's curve).

A load sweep asks where the server starts to suffer. The figure draws, per load point (mean over a
point's repeats, one line per other setting such as the chunk budget): ITL p50 and p99 and the worst
gap; TTFT p90 per prompt bucket; and the achieved request rate against the offered one (the arrivals
the seeded schedule put in the window; a short window offers less or more than the nominal rate, the
diagonal), where a server that cannot keep up falls below what was offered.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.report.data import RunData
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.style import RUN_COLORS, new_figure, seconds_yaxis, tidy

LOAD_KEYS = ("rate", "streams")


def load_axis(runs: list[RunData]) -> str | None:
    """'rate' or 'streams' where the runs differ in it (a load sweep), else None."""
    for key in LOAD_KEYS:
        values = {r.config.get(key) for r in runs}
        if len(values) > 1 and None not in values:
            return key
    return None


def _series_key(run: RunData, axis: str) -> str:
    """What else distinguishes the run (the budget, a user setting): one line per value."""
    settings = dict((run.doc.get("sweep") or {}).get("settings") or {})
    settings.pop(axis, None)
    if settings:
        return ", ".join(f"{k}={v}" for k, v in settings.items())
    return run.setting_label()


def _ttft_p90(summary: dict[str, Any], bucket: str) -> float | None:
    s = (summary.get("ttft_s") or {}).get(bucket) or {}
    if not s.get("count"):
        return None
    return s.get("p90") if s.get("p90") is not None else s.get("max")


def curve_points(runs: list[RunData], axis: str) -> dict[str, list[dict[str, float | None]]]:
    """Per series, per load value (sorted): the mean of each figure over the repeats at that load."""
    acc: dict[str, dict[float, list[RunData]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        acc[_series_key(r, axis)][float(r.config.get(axis) or 0)].append(r)
    out: dict[str, list[dict[str, float | None]]] = {}
    for series, by_load in acc.items():
        pts = []
        for load in sorted(by_load):
            group = by_load[load]

            def mean(values: list[float | None]) -> float | None:
                vals = [v for v in values if v is not None]
                return float(np.mean(vals)) if vals else None

            itl = [(g.summary.get("itl_s") or {}) for g in group]
            point: dict[str, float | None] = {
                "load": load, "itl_p50_s": mean([i.get("p50") for i in itl]),
                "itl_p99_s": mean([i.get("p99") for i in itl]), "worst_gap_s": mean([i.get("max") for i in itl]),
                "achieved_rps": mean([(g.summary.get("throughput") or {}).get("requests_per_s") for g in group]),
                "offered_rps": mean([(g.summary.get("offered") or {}).get("offered_rps") for g in group])}
            for b in (*BUCKET_LABELS, "all"):
                point[f"ttft_p90_{b}_s"] = mean([_ttft_p90(g.summary, b) for g in group])
            pts.append(point)
        out[series] = pts
    return out


def load_figure(runs: list[RunData], rows: object = None) -> FigureSpec:
    axis = load_axis(runs) or "rate"
    # agent sessions arrive at --rate: the x axis counts sessions, the achieved rate requests (several a session),
    # so the two share no diagonal and the offered points (sessions) stay off the requests axis
    sessions = axis == "rate" and any((r.summary.get("offered") or {}).get("unit") == "sessions/s" for r in runs)
    offered = ("nominal rate (sessions/s)" if sessions else "nominal rate (requests/s)") if axis == "rate" \
        else "steady streams"
    spec = FigureSpec("compare_load", "Latency against load",
                      f"Per {offered.split(' (')[0]} (mean over repeats; one colour per other setting): ITL p50 "
                      "(dashed) and p99 (solid) and the worst gap (dotted); TTFT p90 per prompt bucket; and the "
                      "achieved request rate against the offered one (hollow: the arrivals in the window) — "
                      "below what was offered the server no longer keeps up.")
    curves = curve_points(runs, axis)
    fig = new_figure(3.6, 11.0)
    ax_itl, ax_ttft, ax_rate = fig.subplots(1, 3)
    for i, (series, pts) in enumerate(curves.items()):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        x = [p["load"] for p in pts]
        for key, style in (("itl_p50_s", "--"), ("itl_p99_s", "-"), ("worst_gap_s", ":")):
            ys = [p[key] for p in pts]
            ax_itl.plot(x, [np.nan if y is None else y for y in ys], style, marker="o", ms=3, color=color,
                        label=series if key == "itl_p99_s" else None)
        for j, b in enumerate(b for b in BUCKET_LABELS if any(p[f"ttft_p90_{b}_s"] is not None for p in pts)):
            ys = [p[f"ttft_p90_{b}_s"] for p in pts]
            ax_ttft.plot(x, [np.nan if y is None else y for y in ys], marker="os^v<>"[j % 6], ms=3,
                         color=color, alpha=1.0 - 0.12 * j, label=f"{series} {b}" if len(curves) > 1 else b)
        ax_rate.plot(x, [np.nan if p["achieved_rps"] is None else p["achieved_rps"] for p in pts], marker="o",
                     ms=3, color=color, label=series)
        if not sessions and any(p["offered_rps"] is not None for p in pts):
            ax_rate.plot(x, [np.nan if p["offered_rps"] is None else p["offered_rps"] for p in pts], marker="o",
                         ms=5, mfc="none", linestyle="none", color=color)
    if axis == "rate" and not sessions:
        top = max((p["load"] for pts in curves.values() for p in pts), default=1.0)
        ax_rate.plot([0, top], [0, top], color="#999999", linewidth=0.8, linestyle="--", label="nominal")
        ax_rate.plot([], [], marker="o", ms=5, mfc="none", linestyle="none", color="#555555", label="offered")
    for ax, title in ((ax_itl, "inter-token latency"), (ax_ttft, "TTFT p90 by prompt bucket"),
                      (ax_rate, "achieved requests/s" + (" (each session sends several)" if sessions else ""))):
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel(offered)
        tidy(ax)
    for ax in (ax_itl, ax_ttft):  # log only where the values span decades, else linear from zero
        seconds_yaxis(ax, [float(y) for line in ax.get_lines() for y in line.get_ydata()])
    for style, name in (("--", "ITL p50"), ("-", "ITL p99"), (":", "worst gap")):
        ax_itl.plot([], [], style, color="#555555", label=name)
    ax_itl.legend(fontsize=7, frameon=False)
    ax_ttft.legend(fontsize=7, frameon=False)
    if axis == "rate":
        ax_rate.legend(fontsize=7, frameon=False)
    spec.figure = fig
    return spec
