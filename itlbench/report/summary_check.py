"""A run's summary.json, as `report` and `compare` read it, checked against the summary its records give.

The report draws its numbers from summary.json (the figures the run printed) and its figures from the
records. A summary.json damaged or edited by hand (an object that became text, a figure that became a
string, NaN or a number no float holds) reached the formatting code as a TypeError or OverflowError
traceback; it is one line instead, naming the member, with the command that rewrites it from the records.
Members the records' summary lacks (a newer itlbench's) and members either side leaves null are not judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from itlbench.errors import ConfigError

MAX_DEPTH = 8  # summary.json nests 5 deep (stalls.attribution[].prefill_request_ids); a deeper file is not one


def _kind(value: object) -> str | None:
    """The JSON kind the report's code relies on; None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _bad_number(value: object) -> bool:
    """NaN, ±inf (which json reads from NaN/Infinity) or an integer beyond a float: summary.json never has one."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**1023


def _first_problem(disk: object, made: object, key: str, depth: int = 0) -> str | None:
    if depth > MAX_DEPTH:
        return f"{key} nests deeper than any summary"
    if _bad_number(disk):
        shown = f"an integer of {len(str(abs(disk)))} digits" if isinstance(disk, int) else repr(disk)
        return f"{key} is {shown}, not a finite number"
    if isinstance(disk, dict):
        for name, value in disk.items():
            sub = made.get(name) if isinstance(made, Mapping) else None
            found = _first_problem(value, sub, f"{key}.{name}" if key else str(name), depth + 1)
            if found:
                return found
    elif isinstance(disk, list):
        sample = made[0] if isinstance(made, list) and made else None
        for i, value in enumerate(disk):
            found = _first_problem(value, sample, f"{key}[{i}]", depth + 1)
            if found:
                return found
    want, have = _kind(made), _kind(disk)
    if want is not None and have is not None and want != have:
        return f"{key} is {disk!r:.40} ({have}), where the records give {want}"
    return None


def check_summary(disk: dict[str, object], made: dict[str, object], run_dir: str | Path) -> None:
    """Raise ConfigError naming the first member of `disk` (summary.json) that the report cannot read."""
    problem = _first_problem(disk, made, "")
    if problem:
        raise ConfigError(str(Path(run_dir) / "summary.json"), problem,
                          f"run `itlbench analyze {run_dir}` to write it again from the run's records")
