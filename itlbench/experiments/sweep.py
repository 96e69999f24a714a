"""`itlbench sweep`: the same seeded workload once per chunk budget (and policy), then one comparison.

Each setting runs through `itlbench run` itself with the user's run options, into `<sweep dir>/<setting>/`,
so a sweep's runs are ordinary runs (each with its own report) and `itlbench compare` can re-read them.
A run stopped by Ctrl-C or a signal ends the sweep; the comparison still covers the finished runs.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from itlbench.core.engine_config import parse_chunk_budget
from itlbench.errors import ConfigError
from itlbench.report.data import read_json

POLICIES = ("budget", "prefill-first")
OWNED_FLAGS = ("--chunk-budget", "--policy", "--out", "--endpoint")


@dataclass(frozen=True)
class SweepSetting:
    chunk_budget: int | None
    policy: str

    @property
    def dirname(self) -> str:
        name = "unchunked" if self.chunk_budget is None else f"b{self.chunk_budget}"
        return name if self.policy == "budget" else f"{name}-{self.policy}"

    def run_args(self) -> list[str]:
        budget = "none" if self.chunk_budget is None else str(self.chunk_budget)
        return ["--chunk-budget", budget, "--policy", self.policy]


def parse_settings(chunk_budgets: str, policies: str) -> list[SweepSetting]:
    """'256,512,none' × 'budget,prefill-first' → settings, in the order given (bad values name their flag)."""
    budgets = [parse_chunk_budget(b.strip()) for b in chunk_budgets.split(",") if b.strip()]
    if not budgets:
        raise ConfigError("--chunk-budget", "no budget given", "e.g. --chunk-budget 256,512,2048,8192,none")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for p in names:
        if p not in POLICIES:
            raise ConfigError("--policy", f"unknown policy {p!r}", "use budget, prefill-first or both, comma-separated")
    settings = [SweepSetting(b, p) for p in names or ["budget"] for b in budgets]
    if len({s.dirname for s in settings}) < len(settings):
        raise ConfigError("--chunk-budget", "a setting is listed twice", "list each budget once")
    return settings


def check_run_args(args: Sequence[str]) -> None:
    for flag in OWNED_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in args):
            if flag == "--endpoint":
                raise ConfigError("--endpoint", "a sweep changes the bundled engine's chunk budget",
                                  "measure external engines with `itlbench run --endpoint` and compare the runs "
                                  "with `itlbench compare`")
            raise ConfigError(flag, "is set by the sweep itself", "give it to `itlbench sweep`, not as a run option")


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def default_sweep_dir(args: Sequence[str], reports_dir: Path = Path("reports")) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    parts = [stamp, "sweep", _flag_value(args, "--workload") or "chat"]
    inject = _flag_value(args, "--inject")
    if inject:
        parts.append("inj" + re.sub(r"[^0-9a-zA-Z]+", "_", inject))
    return reports_dir / "-".join(parts)


def stopped_early(run_dir: Path) -> bool:
    doc = read_json(run_dir / "run.json") or {}
    return bool(doc.get("interrupted")) or doc.get("stop_reason") in ("stop_event", "interrupted")


def run_sweep(settings: list[SweepSetting], run_args: list[str], out_dir: Path,
              invoke_run: Callable[[list[str]], int], on_status: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Run every setting (in order) into out_dir/<setting>; returns the run directories that finished.
    `invoke_run(args)` runs `itlbench run args` and returns its exit code."""
    check_run_args(run_args)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError("--out", f"{out_dir} already holds files", "choose a new directory")
    done: list[Path] = []
    for i, setting in enumerate(settings, 1):
        run_dir = out_dir / setting.dirname
        on_status(f"sweep {i}/{len(settings)}: {setting.dirname}")
        code = invoke_run([*run_args, *setting.run_args(), "--out", str(run_dir)])
        if code == 2 and not done:  # bad run options: nothing ran, leave nothing behind
            if out_dir.exists() and not any(out_dir.iterdir()):
                out_dir.rmdir()
            raise SweepAborted(code)
        if (run_dir / "run.json").is_file():
            done.append(run_dir)
        if code != 0 or stopped_early(run_dir):
            on_status(f"sweep stopped after {setting.dirname}")
            break
    return done


class SweepAborted(Exception):
    """The first run rejected its options (it printed why); the sweep exits with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"run exited with {code}")
        self.code = code
