"""GPU telemetry through a whole run: what summary.json, the terminal and the report say, on this CPU
machine without NVML, and with an NVML peer standing in for a CUDA device."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from itlbench.core.engine_config import EngineConfig
from itlbench.harness import orchestrate
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.report.run_report import write_run_report
from itlbench.report.terminal import print_summary
from tests.support.nvml import fake_nvml


def _run(tmp_path: Path, name: str, clock: str = "auto") -> tuple[Path, dict]:
    """A simulated run; `clock="real"` serves it in real time, as a CUDA engine is served, so the
    sampler runs beside a live step log (a virtual-clock run samples nothing: no time passes)."""
    cfg = RunConfig(workload="fixed:128:32", streams=2, duration_s=2.0, warmup_s=0.0, live=False, out=tmp_path / name,
                    engine=EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192),
                    clock=clock)
    return run_load_test(cfg)


def _printed(summary: dict, run_dir: Path) -> str:
    buf = io.StringIO()
    print_summary(Console(file=buf, width=200), summary, run_dir)
    return buf.getvalue()


@pytest.mark.parametrize("clock", ["virtual", "real"])
def test_a_simulated_run_says_no_nvml_and_why_in_summary_terminal_and_report(tmp_path: Path, clock: str) -> None:
    run_dir, summary = _run(tmp_path, "sim", clock=clock)
    why = "no NVML: the simulated engine (sim:h100) runs on no GPU"
    assert summary["gpu"] == {"nvml": why}
    assert json.loads((run_dir / "run.json").read_text())["gpu_telemetry"] == {"nvml": why}
    assert not (run_dir / "gpu_samples").exists()
    assert f"GPU {why}" in _printed(summary, run_dir)
    write_run_report(run_dir)
    assert why in (run_dir / "report.md").read_text() and why in (run_dir / "report.html").read_text()


def test_a_cuda_run_without_nvidia_ml_py_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed, as on this machine
    monkeypatch.setattr(orchestrate, "why_not_sampled", lambda device, external: None)  # as if on cuda:0
    run_dir, summary = _run(tmp_path, "no-nvml", clock="real")
    assert summary["gpu"] == {"nvml": "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    write_run_report(run_dir)
    assert "nvidia-ml-py is not installed" in (run_dir / "report.md").read_text()


def test_with_nvml_the_samples_sit_beside_the_steps_and_give_energy_per_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.setattr(orchestrate, "why_not_sampled", lambda device, external: None)
    run_dir, summary = _run(tmp_path, "nvml", clock="real")
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["gpu_telemetry"]["nvml"] == "NVML" and doc["gpu_telemetry"]["samples"] >= 10
    g = summary["gpu"]
    tokens = summary["throughput"]["output_tokens_per_s"] * summary["window"]["seconds"]
    assert g["nvml"] == "NVML" and g["samples"] >= 10 and g["sm_util_mean"] == 50 and g["mem_util_mean"] == 20
    assert g["energy_j"] == pytest.approx(g["samples"] - 1)  # the peer's counter: 1 J per read
    assert g["energy_per_output_token_j"] == pytest.approx(g["energy_j"] / tokens)
    assert "J per output token" in _printed(summary, run_dir)
    write_run_report(run_dir)
    assert "J per output token" in (run_dir / "report.md").read_text()


def test_an_endpoint_that_is_the_served_simulator_says_so_and_carries_its_error_bar(tmp_path: Path) -> None:
    """`itlbench serve --engine sim` measured through --endpoint: the run is told by GET /v1/engine that the times are
    the cost model's, so its GPU line, its engine label and its sim check say so, as for the bundled simulator."""
    from itlbench.report.engines import detect_engine
    from itlbench.rundir.reader import read_table
    from itlbench.server import BackgroundServer, ServerConfig

    engine = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", tp=2, dtype="fp8", max_model_len=8192)
    with BackgroundServer(ServerConfig(engine=engine, port=0)) as srv:
        cfg = RunConfig(workload="fixed:128:32", streams=2, duration_s=2.0, warmup_s=0.0, live=False,
                        out=tmp_path / "ep", endpoint=srv.base_url, model="llama-3.1-8b")
        run_dir, summary = run_load_test(cfg)
    why = "no NVML: the endpoint is itlbench's simulated engine (sim:h100x2), which runs on no GPU"
    assert summary["gpu"] == {"nvml": why} and f"GPU {why}" in _printed(summary, run_dir)
    doc = json.loads((run_dir / "run.json").read_text())
    check = doc["sim_check"]  # the served profile's published error bar, at the served degree
    assert check["label"] == "H100 SXM" and check["format"] == "fp8" and check["tp"] == 2
    assert "Sim check H100 SXM in fp8" in _printed(summary, run_dir)
    label = detect_engine(doc, read_table(run_dir, "server_metrics"), read_table(run_dir, "steps"))
    assert label.name == "itlbench server (llama-3.1-8b, simulated on sim:h100x2)" and label.external
