"""The end of every run, served or simulated: compact the records, say so in run.json, analyze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from itlbench.analysis.summary import analyze_run
from itlbench.rundir.compact import compact_run
from itlbench.rundir.store import RunStore


def finish_run_dir(run_dir: Path, store: RunStore, run_doc: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """An hour-long run's thousands of 2 s parts become a few files (crash-safe: run.json is written
    before, so a crash mid-compaction leaves a readable run); run.json then says how many."""
    store.write_json("run.json", run_doc)
    run_doc["compaction"] = {c.table: {"parts_before": c.parts_before, "parts_after": c.parts_after,
                                       "rows": c.rows} for c in compact_run(run_dir)}
    store.write_json("run.json", run_doc)
    summary = analyze_run(run_dir)
    store.write_json("summary.json", summary)
    return run_dir, summary
