"""Engine steps for the report of a run without a step log (vLLM, SGLang, llama.cpp, any `--endpoint`).

Why: the report's engine-steps figure explains the stall picture, and an external engine publishes no
steps. The client's kernel receive stamps do show them (analysis/inferred_steps.py, measured against the
bundled engine's step log in docs/perf/attribution.md), so the report draws the *inferred* steps instead,
says so in the figure's title and caption, and lists every figure drawn from them. It needs no extra
command: the report (and so the end of every run) infers them itself.

Cost: inference holds the chunks it reads in memory, and a report must not grow with the run
(docs/perf/analysis-scale.md). So only the chunks of the span the figure shows are read (a lazy,
filtered scan of the parquet parts: the zoom around the first injected prefill, else the measured
window), and at most `MAX_ROWS` of them (1M: 6.8 s, 0.7 GB); past that the span is cut to its first `MAX_ROWS` rows' worth
and the caption says how much is drawn. The prefill:decode split needs the whole run: it is taken
from summary-client.json where `analyze --attribution client` wrote one, else estimated here when the
whole run fits in `MAX_ROWS`, else left out with the command that computes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from itlbench.analysis.inferred_steps import infer_steps
from itlbench.analysis.partitions import chunk_parts
from itlbench.rundir.schema import TABLES

if TYPE_CHECKING:
    from itlbench.report.data import RunData

MAX_ROWS = 1_000_000  # chunk rows inferred for the report: 6.8 s, 0.7 GB peak on 2 cores (docs/reports.md)
MARGIN_NS = 2_000_000_000  # chunks read before the span: a prefill drawn at its start began earlier
_COLUMNS = ("request_id", "index", "t_ns", "stamp", "read_chunks")


@dataclass(frozen=True)
class InferredView:
    """Inferred steps (the step log's columns) over [lo_ns, hi_ns]; `split` over the window, if known."""

    steps: pl.DataFrame
    lo_ns: int
    hi_ns: int
    cut: bool  # the span was cut to MAX_ROWS chunk rows
    split: dict[str, Any] | None
    split_note: str | None  # why there is no split


def _scan(data: RunData, lo_ns: int, hi_ns: int) -> pl.LazyFrame | None:
    parts = chunk_parts(data.run_dir)
    if not parts:
        return None
    scan = pl.scan_parquet(parts, missing_columns="insert", extra_columns="ignore")
    names = scan.collect_schema().names()
    # cast as read_table's conform does: a part not typed as itlbench writes it (text in t_ns) reads as nulls
    types = {c: TABLES["chunks"][c] for c in _COLUMNS}
    cols = [(pl.col(c).cast(types[c], strict=False) if c in names else pl.lit(None, dtype=types[c])).alias(c)
            for c in _COLUMNS]
    return scan.select(cols).filter((pl.col("t_ns") >= lo_ns) & (pl.col("t_ns") <= hi_ns))


def _rows(scan: pl.LazyFrame) -> int:
    return int(scan.select(pl.len()).collect().item())


def _client_split(data: RunData) -> dict[str, Any] | None:
    try:
        doc = json.loads((data.run_dir / "summary-client.json").read_text())
    except (OSError, ValueError):
        return None
    split = doc.get("split") or {}
    return split if split.get("prefill_s") is not None else None


def inferred_view(data: RunData, lo_s: float, hi_s: float) -> InferredView | None:
    """Steps inferred from the chunks between lo_s and hi_s (seconds since measure start); None when the run
    has a step log or no chunks."""
    if data.steps.height:
        return None
    from itlbench.analysis.client_summary import inferred_split

    t0, w = data.t0_ns, data.window
    lo_ns, hi_ns = t0 + int(lo_s * 1e9), t0 + int(hi_s * 1e9)
    whole = _scan(data, w.run_start_ns - MARGIN_NS, w.end_ns)
    if whole is None:
        return None
    requests = data.tables["requests"]
    split, note = _client_split(data), None
    if _rows(whole) <= MAX_ROWS:  # one inference serves the figure and the split
        inferred = infer_steps(whole.collect(), requests)
        if split is None:
            split = inferred_split(inferred, w)
        steps = inferred.steps.filter((pl.col("end_ns") > lo_ns) & (pl.col("start_ns") < hi_ns))
        return InferredView(steps, lo_ns, hi_ns, False, split, None)
    if split is None:
        note = (f"the run has more than {MAX_ROWS:,} chunk rows: `itlbench analyze {data.run_dir} --attribution "
                "client` estimates the split from inferred steps over the whole run (summary-client.json)")
    scan = _scan(data, lo_ns - MARGIN_NS, hi_ns)
    assert scan is not None
    rows, cut = _rows(scan), False
    if rows > MAX_ROWS:  # keep the span's head: the first MAX_ROWS rows' worth of time
        hi_ns = int(scan.select(pl.col("t_ns").bottom_k(MAX_ROWS).max()).collect().item())
        scan, cut = _scan(data, lo_ns - MARGIN_NS, hi_ns), True
        assert scan is not None
    inferred = infer_steps(scan.collect(), requests)
    steps = inferred.steps.filter((pl.col("end_ns") > lo_ns) & (pl.col("start_ns") < hi_ns))
    return InferredView(steps, lo_ns, hi_ns, cut, split, note)
