"""The CLI loads polars only for the commands that read or write runs: `itlbench serve` (every served point of a
sweep, every bundled engine's server) and `--help` started a quarter second later for it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import itlbench.cli
import itlbench.rundir.outdir
before = "polars" in sys.modules
from itlbench.rundir import RunStore, read_table  # the package's names still load on first use
print(before, "polars" in sys.modules, RunStore.__module__, read_table.__module__)
"""


def test_the_cli_imports_polars_only_when_a_run_is_read_or_written() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "itlbench.rundir.store", "itlbench.rundir.reader"]
