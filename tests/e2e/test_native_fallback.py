"""A CPU engine without its native library measures the slow torch path; the run must say so in
run.json (engine.serving.warnings, from the runner's RunnerInfo.warnings through the engine process
and GET /v1/engine), and the runner says nothing when the library is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from itlbench.engine.cpu import native
from itlbench.serving.build import create_engine
from tests.support.servers import TINY_ENGINE

pytestmark = pytest.mark.e2e


def test_run_json_records_the_slow_path_warning_and_the_terminal_repeats_it(tmp_path: Path) -> None:
    out = tmp_path / "slow"
    cmd = [sys.executable, "-m", "itlbench", "run", "--model", "tiny", "--device", "cpu", "--workload", "chat-short",
           "--streams", "2", "--duration", "2", "--warmup", "0.5", "--no-live", "--out", str(out), "--json"]
    env = {**os.environ, "ITLBENCH_NATIVE": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = json.loads((out / "run.json").read_text())["engine"]["serving"]["warnings"]
    assert len(warnings) == 1 and "slower torch path" in warnings[0] and "ITLBENCH_NATIVE=0" in warnings[0]
    doc = json.loads(done.stdout)  # --json: stdout is one document, the summary and the warnings
    assert doc["warnings"] == warnings and doc["run_dir"] == str(out)
    assert doc["summary"] == json.loads((out / "summary.json").read_text())


def test_runner_info_warns_only_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_kernel", None)  # forget this process's load: the env decides again
    monkeypatch.setattr(native, "_reason", None)
    monkeypatch.setenv("ITLBENCH_NATIVE", "0")
    (warning,) = create_engine(TINY_ENGINE).runner_info.warnings
    assert "ITLBENCH_NATIVE=0" in warning
    monkeypatch.setattr(native, "_reason", None)
    monkeypatch.delenv("ITLBENCH_NATIVE")
    if native.load() is None:
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    assert create_engine(TINY_ENGINE).runner_info.warnings == ()
