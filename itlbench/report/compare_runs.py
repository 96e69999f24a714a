"""Which runs `itlbench compare` may set side by side: the settings that define the question a run answers
(runs that differ in one answer different ones), and where a comparison may be written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from itlbench.errors import ConfigError
from itlbench.report.compare_ci import swept_settings
from itlbench.report.data import CUT_SHORT_FRACTION, RunData, load_run
from itlbench.report.durations import fmt_s
from itlbench.rundir.reader import RECORD_DOCS

# Settings that define the question a run answers; runs that differ in one answer different ones.
COMPARED = (("workload", "workload"), ("streams", "streams"), ("rate", "rate"), ("burstiness", "burstiness"),
            ("duration_s", "duration"), ("seed", "seed"), ("inject", "inject"),
            ("inject_max_tokens", "inject-max-tokens"), ("trace", "trace"), ("time_scale", "time-scale"))


# Settings whose unset value means "nothing of that kind" rather than a default the run filled in.
ABSENT_WHEN_UNSET = ("inject", "trace", "rate")


def effective_setting(run: RunData, key: str) -> Any:
    """The value a run used: an unset flag (None in its config) is what its load plan filled in (streams: 32), so
    runs that left a default and runs that spelled it out compare equal and the refusal shows a number."""
    value = run.config.get(key)
    if value is None:
        planned = (run.doc.get("plan") or {}).get(key)
        if isinstance(planned, str | int | float):
            value = planned
    return value


def shown_setting(key: str, value: Any) -> str:
    """A setting's value for the refusal line: never Python's 'None' (no injection is 'none', an unknown default
    'default')."""
    if value is None:
        return "none" if key in ABSENT_WHEN_UNSET else "default"
    return str(value)


def measured_duration(run: RunData) -> str:
    """A run's duration as its figures cover it: the planned --duration, and where the run was cut short the
    window it measured beside it (a 30 s run stopped by Ctrl-C after 14.1 s has 14.1 s of figures)."""
    planned = effective_setting(run, "duration_s")
    measured = run.window.seconds
    if isinstance(planned, int | float) and planned > 0:
        if measured < CUT_SHORT_FRACTION * planned:
            return f"{fmt_s(measured)} measured of {planned:g} s planned"
        return f"{planned:g} s"
    return f"{fmt_s(measured)} measured"


def differing_settings(runs: list[RunData]) -> list[str]:
    """'seed (a: 0, b: 1)' for every compared setting whose effective value is not the same in every run; a
    duration is shown as each run measured it."""
    out = []
    swept = swept_settings(runs)
    for key, name in COMPARED:
        if key in swept:
            continue
        values = [effective_setting(r, key) for r in runs]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{r.name}: {measured_duration(r) if key == 'duration_s' else shown_setting(key, v)}"
                              for r, v in zip(runs, values, strict=True))
            out.append(f"{name} ({shown})")
    return out


# What `write_compare_report` writes, and the records of the other commands' directories (never overwritten).
COMPARE_FILES = ("compare.json", "report.html", "report.md")
OTHER_RECORDS = {name: what for name, what in RECORD_DOCS.items() if name not in COMPARE_FILES}


def check_compare_out(out: Path) -> None:
    """Refuse an --out that holds a run, a sweep, a capacity search, a phases study or an earlier comparison:
    writing there would replace their report.html/report.md (and a sweep's compare.json) without a word.
    Other files (a README beside the comparison) stay and do not stop it. `sweep` writes its own comparison
    into its directory through `write_compare_report`, which does not check."""
    if not out.is_dir():
        return  # a new directory, or a path that cannot be one (write_document's make_dir names it)
    for name, what in OTHER_RECORDS.items():
        if (out / name).exists():
            raise ConfigError("--out", f"{out} already holds {what} ({name})", "choose a new directory")
    clash = [name for name in COMPARE_FILES if (out / name).exists()]
    clash += [f"figures/{p.name}" for p in sorted((out / "figures").glob("compare_*.png"))]
    if clash:
        raise ConfigError("--out", f"{out} already holds files compare would overwrite ({', '.join(clash[:3])}"
                          + (f" and {len(clash) - 3} more" if len(clash) > 3 else "") + ")", "choose a new directory")


def load_runs(dirs: list[Path], force: bool = False) -> list[RunData]:
    if len(dirs) < 1:
        raise ConfigError("DIR", "no run directory given", "pass one or more directories written by `itlbench run`")
    runs = [load_run(d) for d in dirs]
    diffs = differing_settings(runs)
    if diffs and not force:
        raise ConfigError("DIR", "the runs differ in " + "; ".join(diffs),
                          "compare runs of one seeded workload and injection, or pass --force")
    return runs
