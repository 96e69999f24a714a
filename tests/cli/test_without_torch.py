"""The harness without the engine extra: torch (and triton) made uninstallable for the CLI and every
process it starts, then the commands a laptop or a pod runs — the simulator, the roofline, a run against
an endpoint — work, and the ones that need the bundled torch engine say which extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from itlbench.server import BackgroundServer, ServerConfig
from tests.support.servers import TINY_ENGINE

# `sys.modules[name] = None` makes `import name` fail and `importlib.util.find_spec(name)` return None,
# exactly as when the package is not installed; sitecustomize carries it into child processes.
BLOCK = "import sys\nfor _m in ('torch', 'triton', 'flash_attn'):\n    sys.modules[_m] = None\n"


def itlbench(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "no-torch-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()])}
    code = BLOCK + "from itlbench.cli import app\nsys.argv = ['itlbench', *sys.argv[1:]]\napp()\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=tmp_path)


def test_the_block_really_hides_torch(tmp_path: Path) -> None:
    site = tmp_path / "s"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK)
    probe = "import importlib.util, sys; print(importlib.util.find_spec('torch')); import torch"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.stdout.strip() == "None" and "ModuleNotFoundError" in done.stderr


@pytest.mark.parametrize("clock", ["virtual", "real"])  # in-process, and served by a child process
def test_roofline_and_a_simulated_run_need_no_torch(tmp_path: Path, clock: str) -> None:
    roof = itlbench(tmp_path, "roofline", "--json")
    assert roof.returncode == 0, roof.stderr
    json.loads(roof.stdout)
    out = tmp_path / "sim-run"
    # served in real time, chat's long answers drained for ~10 s after the window; paced 4x faster (the same
    # served path, a served-only flag) they drain in ~3: what is checked is that no process needs torch
    pace = ["--sim-time-scale", "4"] if clock == "real" else []
    run = itlbench(tmp_path, "run", "--engine", "sim", "--workload", "chat", "--streams", "4", "--duration", "3s",
                   "--warmup", "0s", "--clock", clock, *pace, "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((out / "run.json").read_text()).get("clock", "real") == clock
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["ok"] > 0
    assert (out / "report.html").exists()


def test_a_run_against_an_endpoint_needs_no_torch(tmp_path: Path) -> None:
    with BackgroundServer(ServerConfig(engine=TINY_ENGINE, port=0)) as srv:
        out = tmp_path / "ext-run"
        run = itlbench(tmp_path, "run", "--endpoint", srv.base_url, "--model", TINY_ENGINE.model, "--workload", "chat", "--streams", "2",
                       "--duration", "3s", "--warmup", "0s", "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((out / "summary.json").read_text())["requests"]["ok"] > 0


@pytest.mark.parametrize("args", [("run", "--workload", "chat", "--duration", "2s"), ("serve",),
                                  ("phases", "--repeats", "1"), ("export-model", "llama-3.2-1b", "exported")])
def test_the_torch_engine_commands_name_the_extra_in_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = itlbench(tmp_path, *args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "itlbench[engine]" in lines[0], done.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "exported").exists()
    has_engine_flag = args[0] in ("run", "serve", "phases")  # export-model has no --engine: none offered
    assert ("--engine sim" in lines[0]) is has_engine_flag and lines[0].startswith(
        "error: --engine:" if has_engine_flag else "error: torch:"), lines[0]
