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
    back = tmp_path / "back"  # a remote runner's $OUT: what is written there comes back, a few files at most
    back.mkdir()
    env = {**os.environ, "OUT_DIR": str(tmp_path), "SECTIONS": "env nosuch kernels decode sim", "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "OUT": str(back)}
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
    # the simulator beside every measured decode step (the dry run on CPU checks the logic against h100)
    sim = sections["sim"]
    assert sim["preset"] == "h100" and len(sim["rows"]) == len(rows)
    assert all(r["sim_s"] > 0 and r["error"] == r["sim_s"] / r["measured_s"] - 1 for r in sim["rows"])
    # and its -2025 profile (today's kernels) beside the preset, the same way
    assert all(r["error_2025"] == r["sim_2025_s"] / r["measured_s"] - 1 for r in sim["rows"])
    assert sim["calibration"] == {"error": "no scenario run to calibrate on"} and "sim decode" in proc.stdout
    assert "h100-2025" in proc.stdout
    # the figures and every section's log copied to $OUT as two files (no scenario ran, so no archive)
    assert sorted(f.name for f in back.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    assert json.loads((back / "gpu_check.json").read_text()) == doc and "decode sdpa" in (back / "gpu_check.log").read_text()


def test_the_sim_section_puts_the_preset_beside_each_step_and_calibrates_on_the_scenario(tmp_path: Path) -> None:
    """On a GPU box the sim section reads the other sections' JSON: the device name picks the preset, each
    measured step gets the cost model's time for its shape, and the scenario's run directories are
    calibrated (a real run directory of the CPU engine stands in for the GPU's)."""
    from itlbench.core.presets import PRESETS
    from itlbench.sim.hardware import GPUS
    from itlbench.sim.roofline import CostModel, StepShape
    from tests.support.run_dirs import real_cpu_engine, write_run_dir

    run = write_run_dir(tmp_path / "scenario-2048", real_cpu_engine(256, 0))
    sections = {"env": {"device": "NVIDIA H200", "measured_bandwidth": 4.0e12},
                "decode": {"rows": [{"attention": "triton", "cuda_graphs": True, "graph_ran": True, "batch": 32,
                                     "context": 2048, "step_ms": 9.0}]},
                "prefill": {"rows": [{"attention": "flash", "tokens": 32768, "seconds": 2.5}]},
                "scenario": {"rows": [{"chunk_budget": "2048", "run_dir": str(run)},
                                      {"chunk_budget": "none", "error": "timed out after 80 s"}]}}
    for name, doc in sections.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "sim", "--out", str(tmp_path / "sim.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sim = json.loads((tmp_path / "sim.json").read_text())
    assert sim["preset"] == "h200" and sim["copy_bandwidth_share"] == 4.0e12 / GPUS["h200"].mem_bw
    hw = GPUS["h200"].for_dtype("bfloat16")
    model = PRESETS["llama-3.1-8b"]
    decode, prefill = sim["rows"]
    assert decode["sim_s"] == CostModel.for_hardware(model, hw).time(StepShape.decode(32, 2048), hw).total_s
    eager = CostModel.for_hardware(model, hw, cuda_graphs=False).time(StepShape.decode(32, 2048), hw).total_s
    assert decode["sim_s"] < eager  # the step replayed a graph, so the preset's graph cost applies
    assert prefill["sim_s"] == CostModel.for_hardware(model, hw).time(StepShape.prefill(32768), hw).total_s
    assert prefill["error"] == prefill["sim_s"] / 2.5 - 1
    # the run that timed out is left out; the one that finished is calibrated against the H200's roofs
    assert sim["calibration"]["held_out"]["all"]["steps"] > 5 and (tmp_path / "calibrated.json").is_file()
    assert "sim decode" in proc.stdout and "h200 preset" in proc.stdout


def test_the_device_name_picks_the_preset_with_its_roofs() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # its dataclass looks its module up
    spec.loader.exec_module(gpu_check)
    names = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": None,
             "NVIDIA A100-SXM4-80GB": "a100", "NVIDIA A100 80GB PCIe": "a100-pcie", "NVIDIA A100-SXM4-40GB": None,
             "NVIDIA L40S": "l40s", "cpu": None}
    assert {name: gpu_check.sim_preset(name) for name in names} == names
