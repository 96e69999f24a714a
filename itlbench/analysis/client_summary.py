"""summary-client.json: a run recomputed from its client records alone (`itlbench analyze --attribution client`).

Why: it is what itlbench can say about an engine that publishes no step log, and on the bundled engine,
whose step log is ground truth, it is how the method is measured (benchmarks/attribution_accuracy.py).
The summary is summary.json's, computed without the step log and the server's metrics; `stalls` comes
from inferred steps (client_attribution.py) and `split` is estimated from them (source `client_inferred`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from itlbench.analysis import itl
from itlbench.analysis.client_attribution import ClientStallReport, client_only, client_stalls
from itlbench.analysis.goodput import SloSet, parse_slo
from itlbench.analysis.gpu import gpu_status_of
from itlbench.analysis.inferred_steps import InferredSteps
from itlbench.analysis.run_doc import check_run_doc
from itlbench.analysis.split import split_from_metrics
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.stats import json_safe
from itlbench.analysis.summary import _window_from, summarize
from itlbench.analysis.window import RunWindow, select_window
from itlbench.errors import ConfigError
from itlbench.rundir import load_tables, read_run_doc

ATTRIBUTIONS = ("engine", "client")


def windowed_client_stalls(tables: Mapping[str, pl.DataFrame], window: RunWindow,
                           params: StallParams) -> ClientStallReport:
    """Client-inferred stalls of the steady streams' gaps in the window (as summarize takes them)."""
    t = select_window(client_only(tables), window)
    gaps = itl.gap_table(t["all_chunks"], t["all_requests"]).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    return client_stalls(itl.steady(gaps), t["all_chunks"], t["all_requests"], params, window.measure_start_ns,
                         t["client_pauses"], t["scrapes"])


def inferred_split(inferred: InferredSteps, window: RunWindow) -> dict[str, object]:
    """Prefill:decode from inferred steps in the window: a prefill step counts whole, a mixed step by its
    spacing beyond the decode cadence (the decodes it carried cost about one decode step), the rest decode."""
    s = inferred.steps.filter((pl.col("end_ns") > window.measure_start_ns) & (pl.col("start_ns") < window.end_ns))
    cadence = inferred.cadence_s or 0.0
    span = (pl.col("end_ns") - pl.col("start_ns")) / 1e9
    pre = (pl.when(pl.col("phase") == "prefill").then(span)
           .when(pl.col("phase") == "mixed").then((span - cadence).clip(lower_bound=0.0)).otherwise(0.0))
    prefill_s = float(s.select(pre.sum()).item() or 0.0) if s.height else 0.0
    total = float(s.select(span.sum()).item() or 0.0) if s.height else 0.0
    decode_s = max(total - prefill_s, 0.0)
    return {"prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_frac": prefill_s / total if total > 0 else None, "source": "client_inferred",
            "note": "inferred step spacing (step + hand-off), slow unexplained steps counted as decode"}


def summarize_client(tables: Mapping[str, pl.DataFrame], window: RunWindow, slos: SloSet | None = None,
                     params: StallParams | None = None, plan: Mapping[str, object] | None = None,
                     gpu_status: str | None = None) -> dict[str, object]:
    """summary.json's keys from client records alone, stalls and split inferred (see the module docstring);
    `gpu_status` is run.json's word on why there are no GPU samples, as summary.json has it."""
    params = params or StallParams()
    out = summarize(client_only(tables), window, slos, params, gpu_status=gpu_status, plan=plan)
    report = windowed_client_stalls(tables, window, params)
    out["stalls"] = report.report.summary
    out["split"] = inferred_split(report.inferred, window)
    out["attribution"] = {"source": "client_inferred", "inputs": ["requests", "chunks", "client_samples",
                                                                   "client_pauses", "scrapes"],
                          "ignored": ["steps", "server_metrics"]}
    out["crosscheck"] = {**(out.get("crosscheck") or {}),  # type: ignore[dict-item]
                         "server_counters": server_counter_check(tables, window, out["split"])}  # type: ignore[arg-type]
    return json_safe(out)  # type: ignore[return-value]


def server_counter_check(tables: Mapping[str, pl.DataFrame], window: RunWindow,
                         inferred: dict[str, object]) -> dict[str, object] | None:
    """Where the server published prefill/decode time counters (vLLM's request_{prefill,decode}_time
    sums, SGLang's execution seconds), their split beside the inferred one: a second source, not an input
    (null when the run scraped none)."""
    metrics = tables.get("server_metrics")
    if metrics is None or metrics.is_empty():
        return None
    found = split_from_metrics(metrics, window)
    if found is None:
        return None
    return {"source": found.get("source"), "prefill_s": found.get("prefill_s"), "decode_s": found.get("decode_s"),
            "prefill_frac": found.get("prefill_frac"), "inferred_prefill_frac": inferred.get("prefill_frac")}


def analyze_run_client(run_dir: str | Path) -> dict[str, object]:
    """Summarize a stored run from its client records alone (reads run.json and the tables; writes nothing)."""
    path = Path(run_dir, "run.json")
    if not path.is_file():
        raise ConfigError("run_dir", f"{path} not found", "pass a directory written by `itlbench run`")
    meta = read_run_doc(run_dir)  # one line where it is not JSON, or not an object
    check_run_doc(meta, run_dir)
    slo = meta.get("slo")
    plan = meta.get("plan")
    return summarize_client(load_tables(run_dir), _window_from(meta), parse_slo(slo if isinstance(slo, str) else None),
                            StallParams.from_meta(meta), plan=plan if isinstance(plan, dict) else None,
                            gpu_status=gpu_status_of(meta))
