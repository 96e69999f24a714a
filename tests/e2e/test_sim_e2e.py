"""The source documents' scenario end to end on any box: `itlbench run --engine sim` on a simulated H100."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from itlbench.core.presets import PRESETS
from itlbench.sim.roofline import CostModel, StepShape, load_hardware

pytestmark = pytest.mark.e2e

SCALE = 2.0  # simulated seconds per wall second: every measured time is half the simulated one


def sim_run(out: Path, budget: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "itlbench", "run", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100-seeds",
           "--inject", "32k", "--chunk-budget", budget, "--workload", "chat-short", "--streams", "16",
           "--duration", "4", "--warmup", "1", "--sim-time-scale", str(SCALE), "--seed", "3", "--no-live", "--no-report",
           "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def finished(proc: subprocess.Popen[str], out: Path) -> dict:
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout + stderr
    assert f"simulated at {SCALE:g}× speed" in stderr
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Both runs at once: each is paced by its own simulated clock, on its own port (half the wall time)."""
    tmp = tmp_path_factory.mktemp("sim")
    procs = {name: sim_run(tmp / name, budget) for name, budget in (("none", "none"), ("2k", "2k"))}
    try:
        return {name: (tmp / name, finished(proc, tmp / name)) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_unchunked_32k_prefill_stalls_every_stream_for_seconds(runs: dict) -> None:
    run_dir, summary = runs["none"]
    worst = summary["stalls"]["worst_s"] * SCALE
    seeds = load_hardware("h100-seeds")  # the source documents' arithmetic
    prefill = CostModel.for_hardware(PRESETS["llama-3.1-8b"], seeds).time(StepShape.prefill(32768), seeds).total_s
    assert prefill > 2.0 and worst >= 0.95 * prefill  # the source documents' ≈ 2 s stall, multi-second
    steps = pl.read_parquet(run_dir / "steps/*.parquet")
    biggest = steps.sort("prefill_tokens").tail(1)
    assert biggest["prefill_tokens"][0] >= 32768 and biggest["attention_pairs"][0] >= 32768 * 32769 // 2
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["engine"]["engine"] == "sim" and run["engine"]["device"] == "sim:h100-seeds"


def test_budget_2048_makes_the_worst_gap_far_smaller(runs: dict) -> None:
    _, unchunked = runs["none"]
    run_dir, chunked = runs["2k"]
    assert chunked["stalls"]["worst_s"] * SCALE < 0.4  # the longest chunk, ≈ 0.17 s simulated
    assert chunked["stalls"]["worst_s"] * 5 < unchunked["stalls"]["worst_s"]
    steps = pl.read_parquet(run_dir / "steps/*.parquet")
    assert steps["prefill_tokens"].max() <= 2048
    for summary in (unchunked, chunked):
        assert summary["requests"]["injected"] == 1 and summary["requests"]["error"] == 0
