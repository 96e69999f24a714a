"""What every figure of a report shares: the figure (or the note in its place) with its title and caption,
and the engine steps a figure draws (logged, or inferred from the client's stamps when the engine logs none)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from matplotlib.figure import Figure

from itlbench.report.data import RunData
from itlbench.report.inferred import InferredView, inferred_view
from itlbench.report.timeline import InjectedSpan, injected_spans


@dataclass
class FigureSpec:
    """A figure (or, when the run cannot draw it, a note) with its file stem, title and caption."""

    key: str
    title: str
    caption: str
    figure: Figure | None = None
    note: str | None = None
    inferred: bool = False  # drawn from steps inferred from the client's stamps, not from a step log
    withdrawn: str | None = None  # why the run's validity verdict withdrew what this figure shows


def steps_s(data: RunData, whole_run: bool = False, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Steps in the window (or all of them) with seconds since measure start and durations."""
    t0 = data.t0_ns
    steps = data.steps if steps is None else steps
    steps = steps if whole_run else steps.filter((pl.col("end_ns") > t0) & (pl.col("start_ns") < data.window.end_ns))
    return (steps
            .with_columns(((pl.col("start_ns") - t0) / 1e9).alias("t_s"),
                          ((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("dur_s"),
                          pl.col("prefill_tokens").fill_null(0), pl.col("decode_tokens").fill_null(0))
            .sort("start_ns"))


def zoom(data: RunData, spans: list[InjectedSpan]) -> tuple[float, float, str]:
    """Around the first injected prefill (with margins), else the whole window."""
    if spans:
        s = spans[0]
        pad = max(1.0, 0.15 * (s.end_s - s.start_s))
        lo, hi = max(0.0, s.start_s - pad), s.end_s + pad  # the whole prefill, even past the window
        more = f" (first of {len(spans)} injected prompts)" if len(spans) > 1 else ""
        return lo, hi, f"around {s.request_id}'s prefill{more}"
    return 0.0, data.window.seconds or 1.0, "the whole measured window"  # a window of 0 s: a run that ended in
    # its warm-up (matplotlib warns of, and widens, an axis from 0 to 0)


INFERRED_CAPTION = ("Inferred, not logged: {engine} publishes no step log, so each step is reconstructed from the "
                    "client's kernel receive stamps (one cluster of chunks across streams per step; a step's width "
                    "is its spacing, step plus hand-off) and its prefill tokens are estimated from "
                    "usage.prompt_tokens.{cut}")


def inferred_for(data: RunData) -> InferredView | None:
    """The inferred steps of a run without a step log, over the engine-steps figure's span (computed once)."""
    if "view" not in data.inferred_cache:
        lo, hi, _ = zoom(data, injected_spans(data, whole_run=True))
        data.inferred_cache["view"] = inferred_view(data, lo, hi)
    return data.inferred_cache["view"]  # type: ignore[no-any-return]
