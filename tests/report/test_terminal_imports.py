"""The terminal summary a `--no-report` or `--json` run prints needs no plotting library: matplotlib takes
about half a second to import, paid by every such run for nothing."""

from __future__ import annotations

import subprocess
import sys


def test_the_terminal_summary_imports_no_matplotlib() -> None:
    probe = "import sys, itlbench.report.terminal; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
