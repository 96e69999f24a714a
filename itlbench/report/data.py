"""One run directory, read once for every figure and table of a report.

The summary's numbers come from `summary.json` (recomputed when it is missing, or when a part file it
counted no longer reads, so that a number and its figure agree and the report names the file); the per-stall and
per-request frames the figures need come from the same analysis (`summarize_dir`, reused when
`itlbench analyze` just ran it in this process), so a figure and the number printed beside it cannot
disagree. No figure holds every gap: a run of 100M chunk rows is drawn from its stalls, its per-request
spans, a background sample of at most `analysis.scale.SAMPLE_POINTS` gaps, output tokens per second
and a fixed number of quantiles, so the report's cost and size do not grow with the run. The chunks
table is therefore not among `tables`. A run killed before it wrote its window still gets one,
inferred from its records, and the report says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.analysis.partitions import chunk_parts
from itlbench.analysis.run_doc import check_run_doc
from itlbench.analysis.scale import ChunkFigures
from itlbench.analysis.summary import recall, summarize_meta
from itlbench.analysis.window import RunWindow
from itlbench.errors import ConfigError
from itlbench.report.durations import fmt_s
from itlbench.report.engines import EngineLabel, detect_engine
from itlbench.report.summary_check import check_summary
from itlbench.rundir.reader import read_table
from itlbench.rundir.schema import TABLES, empty

CUT_SHORT_FRACTION = 0.95  # a measured window shorter than this share of --duration was cut short


@dataclass
class RunData:
    """Everything a report draws from. Times in frames stay perf_counter ns; `t0_ns` is measure start."""

    run_dir: Path
    doc: dict[str, Any]
    summary: dict[str, Any]
    window: RunWindow
    tables: dict[str, pl.DataFrame]  # every table but chunks (empty: see `chunks`)
    chunks: ChunkFigures  # spans, background sample, open gaps, tokens per second, CDF quantiles
    stalls: pl.DataFrame  # stalled steady gaps with cause
    events: pl.DataFrame
    ttft: pl.DataFrame  # ttft.ttft_table of the window's requests
    judged: pl.DataFrame  # goodput.judge rows
    engine: EngineLabel
    cut_short: list[str] = field(default_factory=list)
    window_inferred: bool = False
    inferred_cache: dict[str, Any] = field(default_factory=dict)  # report/inferred.py's steps, computed once

    @property
    def t0_ns(self) -> int:
        return self.window.measure_start_ns

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.doc.get("config") or {})

    @property
    def engine_config(self) -> dict[str, Any] | None:
        """The bundled (or itlbench external) engine's scheduler settings, if known."""
        eng = self.doc.get("engine") or {}
        inner = eng.get("engine") or (eng.get("itlbench") or {}).get("engine")
        return dict(inner) if isinstance(inner, dict) else None

    @property
    def steps(self) -> pl.DataFrame:
        return self.tables["steps"]

    @property
    def name(self) -> str:
        return self.run_dir.name

    def setting_label(self) -> str:
        """What distinguishes this run in a comparison: budget/policy for itlbench engines, else the engine."""
        eng = self.engine_config
        if eng is None:
            return self.engine.name
        budget = eng.get("chunk_budget")
        text = "unchunked" if budget is None else f"budget {budget}"
        if eng.get("policy") and eng.get("policy") != "budget":
            text += f", {eng['policy']}" + (" +mixed" if eng.get("mixed") else "")
        return text if not self.engine.external else f"{self.engine.name}: {text}"


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk; None when it is missing, unreadable or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return doc if isinstance(doc, dict) else None


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (raises ConfigError naming RUN_DIR when it is not one)."""
    path = Path(run_dir)
    doc = read_json(path / "run.json")
    if doc is None:
        raise ConfigError("RUN_DIR", f"{path} has no readable run.json",
                          "pass a directory written by `itlbench run`")
    check_run_doc(doc, path)
    tables = {name: read_table(path, name) if name != "chunks" else empty(name) for name in TABLES}
    window, inferred = _window(doc, tables, path)
    summary = read_json(path / "summary.json")
    kept = None if inferred else recall(path)
    computed, analysis = kept or summarize_meta(path, doc, window)
    if summary is None or inferred or _left_out_since(summary, computed):
        summary = computed  # type: ignore[assignment]
    else:
        check_summary(summary, computed, path)
    data = RunData(path, doc, summary, window, tables, analysis.chunks, analysis.stalls.stalls,
                   analysis.stalls.events, analysis.ttft, analysis.judged,
                   detect_engine(doc, tables["server_metrics"], tables["steps"]), window_inferred=inferred)
    data.cut_short = cut_short_reasons(data)
    return data


def _left_out_since(summary: dict[str, Any], computed: dict[str, Any]) -> bool:
    """A part file no longer reads that summary.json counted (a copy cut short since): its numbers are of records
    the figures no longer have, and it does not name the file left out. The records' summary does both."""
    now = computed.get("unreadable_parts") or []
    then = summary.get("unreadable_parts")
    return bool(now) and sorted(now) != sorted(then if isinstance(then, list) else [])


def _chunk_span(path: Path) -> tuple[int | None, int | None]:
    """First and last chunk arrival, read lazily (the chunks are not held)."""
    parts = chunk_parts(path)
    if not parts:
        return None, None
    try:
        lo, hi = pl.scan_parquet(parts, missing_columns="insert", extra_columns="ignore").select(
            pl.col("t_ns").cast(pl.Int64).min().alias("lo"), pl.col("t_ns").cast(pl.Int64).max().alias("hi")
        ).collect().row(0)
    except pl.exceptions.PolarsError:  # a part not typed as itlbench writes it: read as read_table coerces it
        t_ns = read_table(path, "chunks")["t_ns"]
        lo, hi = t_ns.min(), t_ns.max()
    return lo, hi  # type: ignore[return-value]


def _window(doc: dict[str, Any], tables: dict[str, pl.DataFrame], path: Path) -> tuple[RunWindow, bool]:
    """The run's own window, or (killed before it wrote one) the span of its records."""
    if isinstance(doc.get("run_start_ns"), int) and isinstance(doc.get("end_ns"), int):
        start = int(doc["run_start_ns"])
        measure = doc.get("measure_start_ns")
        return RunWindow(start, int(measure) if isinstance(measure, int) else start, int(doc["end_ns"])), False
    first, last = _chunk_span(path)
    times = [v for v in (tables["requests"]["scheduled_ns"].min(), first) if v is not None]
    if not times:
        raise ConfigError("RUN_DIR", "run.json has no window and the run recorded no requests",
                          "nothing to report: the run ended before it sent anything")
    start = int(min(times))  # type: ignore[call-overload]
    ends = [v for v in (last, tables["requests"]["done_ns"].max()) if v is not None]
    end = int(max(ends)) if ends else start  # type: ignore[call-overload]
    warmup = float((doc.get("config") or {}).get("warmup_s") or 0.0)
    measure = min(start + int(warmup * 1e9), end)
    return RunWindow(start, measure, end), True


def cut_short_reasons(data: RunData) -> list[str]:
    """Plain sentences for every sign that the run did not run its course (empty: it did)."""
    return run_cut_short(data.doc, data.window.seconds, data.window_inferred)


def unreadable_line(summary: dict[str, Any]) -> str | None:
    """Record files the analysis had to leave out (their footers do not read), for the terminal and report."""
    parts = summary.get("unreadable_parts") or []
    if not parts:
        return None
    shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
    return (f"{len(parts)} record file{'s' if len(parts) > 1 else ''} could not be read (cut short on disk) and "
            f"{'are' if len(parts) > 1 else 'is'} left out of every figure: {shown}")


SIGNAL_WORDS = {"SIGINT": "Ctrl-C (SIGINT)", "SIGTERM": "SIGTERM"}


def run_cut_short(doc: dict[str, Any], measured_s: float, window_inferred: bool = False) -> list[str]:
    """`cut_short_reasons` from run.json and the measured window's length: what the terminal prints too."""
    reasons: list[str] = []
    if window_inferred or doc.get("provisional"):
        reasons.append("the run was killed before it wrote its end time; its window is inferred from "
                       "the records it had flushed")
    signal = doc.get("signal")
    if signal:  # the signal the run recorded: one sentence, naming it
        reasons.append(f"it was stopped by {SIGNAL_WORDS.get(str(signal), str(signal))}")
    elif doc.get("interrupted"):
        reasons.append("it was interrupted (Ctrl-C)")
    elif doc.get("stop_reason") in ("stop_event", "interrupted"):
        reasons.append("it was stopped by a signal")
    if doc.get("aborted_reason"):
        reasons.append(f"it was aborted: {doc['aborted_reason']}")
    code = doc.get("server_exit_code")
    if code is not None:
        reasons.append(f"the engine server died during the run (exit code {code})")
    planned = (doc.get("config") or {}).get("duration_s")
    if isinstance(planned, int | float) and planned > 0 and measured_s < CUT_SHORT_FRACTION * planned:
        reasons.append(f"it measured {fmt_s(measured_s)} of the planned {planned:g} s")
    return reasons
