"""The summary computed as before analysis scaled out of core (commit 08b491e): every chunk row in
memory, one polars frame of every gap (`summarize`, which client-only attribution still uses). The
out-of-core path (`summarize_dir`) must equal it on runs that fit in memory: it runs the same
per-request functions partition by partition, and selects every pooled figure out of core instead of
over the whole table at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from itlbench.analysis.goodput import SloSet, parse_slo
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import _window_from, summarize
from itlbench.analysis.window import RunWindow
from itlbench.rundir import load_tables


def reference_summary(tables: Mapping[str, pl.DataFrame], window: RunWindow, slos: SloSet | None = None,
                      stall_params: StallParams | None = None) -> dict[str, object]:
    """The in-memory computation (`summarize`: every chunk row and one frame of every gap)."""
    return summarize(tables, window, slos, stall_params)


def reference_of_dir(run_dir: str | Path) -> dict[str, object]:
    """`reference_summary` of a stored run, read whole (as `analyze_run` read it before)."""
    meta = json.loads(Path(run_dir, "run.json").read_text())
    slo = meta.get("slo")
    return reference_summary(load_tables(run_dir), _window_from(meta),
                             parse_slo(slo if isinstance(slo, str) else None), StallParams.from_meta(meta))


# Sums and means are added in a different order when merged over partitions: they may differ in their
# last bits, nothing more. Everything else (counts, max, percentiles, stalls, verdicts) must be equal.
FLOAT_REL = 1e-12


def differences(mine: object, ref: object, path: str = "") -> list[str]:
    """Every place two summaries differ (floats beyond FLOAT_REL), as 'path: mine != ref'."""
    if isinstance(mine, dict) and isinstance(ref, dict):
        out = [f"{path}.{k}: missing" for k in set(mine) ^ set(ref)]
        for k in set(mine) & set(ref):
            out += differences(mine[k], ref[k], f"{path}.{k}")
        return out
    if isinstance(mine, list) and isinstance(ref, list):
        if len(mine) != len(ref):
            return [f"{path}: {len(mine)} items != {len(ref)}"]
        return [d for i, (a, b) in enumerate(zip(mine, ref, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(mine, float) and isinstance(ref, float) and not isinstance(mine, bool):
        same = math.isclose(mine, ref, rel_tol=FLOAT_REL, abs_tol=1e-300)
        return [] if same else [f"{path}: {mine!r} != {ref!r}"]
    return [] if mine == ref and type(mine) is type(ref) else [f"{path}: {mine!r} != {ref!r}"]
