"""`benchmarks/gpu_check.sh --dry-run`: the GPU check's own logic on CPU at tiny shapes (sections that
need no server; the whole dry run, scenario included, takes about a minute by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "OUT_DIR": str(tmp_path), "SECTIONS": "env nosuch kernels decode", "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    # a section that fails (here: one that does not exist) is reported; the others still run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["failed_sections"] == ["nosuch"] and "error" in doc["sections"]["nosuch"]
    sections = doc["sections"]
    assert sections["env"]["backends"] == ["sdpa", "triton"]
    kernels = sections["kernels"]
    assert kernels["ok"] and all(row["triton"]["ok"] for row in kernels["rows"])
    rows = sections["decode"]["rows"]
    assert {(r["attention"], r["cuda_graphs"]) for r in rows} == {("sdpa", False), ("triton", True), ("triton", False)}
    assert all(r["step_ms"] > 0 and r["floor_ms"] > 0 and not r["graph_ran"] for r in rows)
    assert all(a["greedy_tokens_equal_to_sdpa"] == 1.0 for a in sections["decode"]["agreement"])
    assert "kernels vs SDPA: PASS" in proc.stdout and "failed sections: nosuch" in proc.stdout
