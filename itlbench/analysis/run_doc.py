"""run.json's members that the analysis and the report read, checked once before either reads them.

A hand-edited or damaged run.json (a number where an object was, a window mark that is text or out of range,
a stall rule no run accepts) is one line naming the member and the fix, not a traceback from the figure that
happened to read it first. Members a newer itlbench may add are not looked at; absent ones are not an error
(a run killed before it wrote its window still gets a report, its window inferred from its records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from itlbench.errors import ConfigError

FIX = "restore run.json from a copy of the run directory, or correct that member"
# Members that hold an object (or null) wherever they are written; the report reads into each.
OBJECTS = ("config", "engine", "plan", "sim_check", "hardware", "gpu_telemetry")
NESTED_OBJECTS = (("config", "engine"), ("engine", "engine"), ("engine", "itlbench"))
WINDOW = ("run_start_ns", "measure_start_ns", "end_ns")
MAX_WINDOW_NS = 366 * 86_400 * 10**9  # a year: no run lasts longer; beyond it a mark is damage, not a run


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_run_doc(meta: Mapping[str, object], run_dir: str | Path) -> None:
    """Raise ConfigError naming `run_dir`/run.json and the first member the analysis cannot read."""
    where = str(Path(run_dir) / "run.json")

    def refuse(problem: str) -> None:
        raise ConfigError(where, problem, FIX)

    for key in OBJECTS:
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            refuse(f"{key} is {meta[key]!r:.60}, not an object")
    for outer, inner in NESTED_OBJECTS:
        value = (meta.get(outer) or {}).get(inner)  # type: ignore[attr-defined]
        if value is not None and not isinstance(value, dict):
            refuse(f"{outer}.{inner} is {value!r:.60}, not an object")
    marks = {}
    for key in WINDOW:
        value = meta.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            refuse(f"{key} is {value!r:.60}, not an integer (nanoseconds on the run's clock)")
        if value is not None:
            marks[key] = value
    start = marks.get("run_start_ns")
    for key in ("measure_start_ns", "end_ns"):  # a run that failed in its warm-up ends before its window opens
        if start is not None and key in marks and not 0 <= marks[key] - start <= MAX_WINDOW_NS:
            span = f"{(marks[key] - start) / 86_400e9:.3g} days after run_start_ns, longer than any run"
            refuse(f"{key} ({marks[key]}) is " + (f"before run_start_ns ({start})" if marks[key] < start else span))
    factor, floor = meta.get("stall_factor"), meta.get("stall_floor_s")
    if factor is not None and not (_number(factor) and factor > 1):  # type: ignore[operator]
        refuse(f"stall_factor is {factor!r:.60}; the stall rule needs a number > 1 (--stall-factor)")
    if floor is not None and not (_number(floor) and floor >= 0):  # type: ignore[operator]
        refuse(f"stall_floor_s is {floor!r:.60}; the stall rule needs seconds >= 0 (--stall-floor)")
    slo = meta.get("slo")
    if slo is not None:
        if not isinstance(slo, str):
            refuse(f"slo is {slo!r:.60}, not the --slo text the run was given")
        from itlbench.analysis.goodput import parse_slo

        try:
            parse_slo(slo)  # type: ignore[arg-type]
        except ConfigError as exc:
            refuse(f"slo {exc.problem}")
