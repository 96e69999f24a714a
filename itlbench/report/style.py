"""Colours, sizes and small helpers every report figure shares, so one colour means one thing.

Figures are built on `matplotlib.figure.Figure` (the Agg canvas, no pyplot state), which keeps
report rendering safe inside a long-lived process and free of any display.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter, NullFormatter
from matplotlib.transforms import Bbox

from itlbench.report.durations import fmt_s
from itlbench.units import format_tokens

STREAMING = "#4c78a8"        # tokens arriving at their usual pace
PREFILL = "#e45756"          # prefill tokens, and stalls caused by prefill
DECODE = "#4c78a8"           # decode tokens
MIXED = "#b279a2"            # steps carrying both
IDLE = "#bab0ac"
WAITING = "#c9c9c9"          # a request sent and waiting for its first token
INJECTED_SPAN = "#f58518"    # the injected prompt's prefill, shaded behind every panel
GOOD = "#54a24b"
MISSED = "#e45756"
MUTED = "#9d9d9d"
BAD_TEXT = "#b3261e"          # a withdrawn figure's mark (as the HTML's .withdrawn)

CAUSE_COLORS = {"prefill": PREFILL, "engine": "#9467bd", "preemption": "#8c564b",
                "outside_engine": "#f2a900", "client": "#7f7f7f", None: "#e377c2", "unknown": "#e377c2"}
CAUSE_NAMES = {"prefill": "prefill step(s)", "engine": "one long engine step", "preemption": "preemption",
               "outside_engine": "outside the engine (HTTP, network)", "client": "the client's own pause",
               None: "unknown (no step log)", "unknown": "unknown (no engine step explains it)"}
PHASE_COLORS = {"prefill": PREFILL, "mixed": MIXED, "decode": DECODE, "idle": IDLE}
RUN_COLORS = ("#4c78a8", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#9d755d", "#ff9da6")
WIDTH_IN = 11.0
DPI = 110


def new_figure(height_in: float, width_in: float = WIDTH_IN) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    return fig


def tidy(ax: Axes) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.6)
    ax.set_axisbelow(True)


def time_axis(ax: Axes, seconds: float) -> None:
    """x from 0 to the measured window; a run cut short before its window opened has none (a millisecond)."""
    ax.set_xlim(0, max(seconds, 1e-3))


def gap_cdf_axes(ax: Axes, lo_q: float, hi_q: float) -> None:
    """The ITL CDF's logit y axis between lo_q and hi_q (percent ticks, no minor labels), the
    labels and the legend: one look for the single-run and the comparison figure."""
    ax.set_yscale("logit")
    ax.set_ylim(lo_q, hi_q)
    ticks = [q for q in (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999) if lo_q <= q <= hi_q]
    ax.set_yticks(ticks, [f"{q * 100:g} %" for q in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("gap between consecutive tokens of one stream")  # the ticks carry their units
    ax.set_ylabel("share of gaps ≤ x")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    tidy(ax)


def seconds_log_yaxis(ax: Axes) -> None:
    """A log y axis of seconds labelled as durations ("50 ms"), minor ticks too where the view spans
    under two decades (else matplotlib's own 10^-2 labels would sit between "100 ms" and "1 s")."""
    ax.set_yscale("log")
    _log_ticks(ax.yaxis, ax.get_ylim)


def seconds_log_xaxis(ax: Axes) -> None:
    """`seconds_log_yaxis` for the x axis."""
    ax.set_xscale("log")
    _log_ticks(ax.xaxis, ax.get_xlim)


def count_log_yaxis(ax: Axes) -> None:
    """A log y axis of counts or rates labelled as numbers ("2,000"), not matplotlib's 2×10^3."""
    ax.set_yscale("log")
    _log_ticks(ax.yaxis, ax.get_ylim, lambda v: f"{v:,.0f}" if v >= 1 else f"{v:g}")


MINOR_LABEL_PX = {"x": 180.0, "y": 100.0}  # a decade at least this long (pixels) has room for its 2s and 5s labelled


def _log_ticks(axis: Axis, limits: Callable[[], tuple[float, float]],
                    fmt: Callable[[float], str] = fmt_s) -> None:
    """Major ticks as `fmt` writes them (durations by default); minor ones too where the view is narrow enough
    to need them: every one within a decade, the 2s and 5s within two, or wherever a decade is drawn long
    enough to hold them (20 ms and 50 ms between 10 and 100 ms, where a 2-core run's gaps lie: a view of 2.5
    decades otherwise labels only 100 ms and 1 s, and the data between them cannot be read)."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))

    def minor(v: float, _: int) -> str:
        lo, hi = limits()
        if lo <= 0 or hi <= lo:
            return ""
        span = math.log10(hi / lo)
        lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9)) if v > 0 else 0
        roomy = span < 2 or _decade_px(axis, span) >= MINOR_LABEL_PX[axis.axis_name]
        return fmt(v) if span < 1 or (roomy and lead in (2, 5)) else ""

    axis.set_minor_formatter(FuncFormatter(minor))


def _decade_px(axis: Axis, span: float) -> float:
    """How many pixels one decade of the axis takes as drawn (its axes' extent over the decades it spans)."""
    box = axis.axes.bbox
    return (box.width if axis.axis_name == "x" else box.height) / span


def seconds_yaxis(ax: Axes, values: Iterable[float], ratio: float = 20.0) -> bool:
    """A y axis of seconds labelled as durations: log only where the values span decades (more than
    `ratio`× from the least to the most), else linear from zero, so
    bars start at zero and a 4 % difference looks like one. Returns whether it went log."""
    positive = [float(v) for v in values if v is not None and float(v) > 0]
    if positive and max(positive) / min(positive) > ratio:
        seconds_log_yaxis(ax)
        return True
    ax.set_ylim(0, max(positive) * 1.15 if positive else 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_s(v)))
    return False


def fit_labels(fig: Figure, ax: Axes, labels: list[Annotation], gap_px: float = 2.0) -> float:
    """Lay the figure out as savefig will, then move each label (offset in points) sideways into the axes'
    width and lift one that would cover an earlier one above it: a label placed by its data point alone runs
    past the edge for a point near it, or over its neighbour's. Returns how far (points) the highest was lifted."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()
    inside = ax.get_window_extent(renderer)
    points = 72.0 / fig.dpi
    placed: list[Bbox] = []
    lifted = 0.0
    for label in labels:
        box = label.get_window_extent(renderer)
        dx = max(0.0, inside.x0 - box.x0) - max(0.0, box.x1 - inside.x1)
        dy = 0.0
        for _ in range(len(placed)):  # each lift clears one neighbour; it may land on another
            moved = box.translated(dx, dy)
            above = [b.y1 + gap_px - moved.y0 for b in placed if moved.overlaps(b)]
            if not above:
                break
            dy += max(above)
        if dx or dy:
            x, y = label.xyann
            label.xyann = (x + dx * points, y + dy * points)
        placed.append(box.translated(dx, dy))
        lifted = max(lifted, dy * points)
    return lifted


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def save_png(fig: Figure, path: Path) -> bytes:
    data = png_bytes(fig)
    path.write_bytes(data)
    return data


def fmt_tokens(n: int | float | None) -> str:
    """32k when a multiple of 1024 (k = 1024 tokens everywhere), else grouped digits; — when unknown."""
    return "—" if n is None else format_tokens(int(n))
