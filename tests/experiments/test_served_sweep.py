"""`itlbench sweep --serve`: a real server per point from a template, failures recorded, no server outlives it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from itlbench.cli import app

pytestmark = pytest.mark.e2e
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
PY = shlex.quote(sys.executable)
# the simulated engine behind the real server: a GPU's pacing at little CPU
SIM_SERVE = (f"{PY} -m itlbench serve --engine sim --model llama-3.1-8b --gpu h100 --port {{port}} "
             "--chunk-budget {chunk_budget}")
# a 1 s window holds ~16 requests of 32 tokens (~0.25 s each on the H100 preset): what a point needs to be compared
RUN = ["--no-report", "--model", "llama-3.1-8b", "--workload", "fixed:128:32", "--streams", "4", "--duration", "1", "--warmup", "0.5",
       "--no-live"]


@pytest.fixture(autouse=True)
def _children_import_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _flat(text: str) -> str:
    return " ".join(text.split())


def _alive(marker: str) -> list[psutil.Process]:
    """Live servers started from a template holding `marker` (the sweep's own command line holds the
    template, with `{port}` unfilled: not a server)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if (marker in cmd and "{port}" not in cmd and p.info["status"] != psutil.STATUS_ZOMBIE
                and p.pid != os.getpid()):
            out.append(p)
    return out


def test_each_point_gets_its_server_and_a_failing_one_is_recorded_while_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    serve = SIM_SERVE + " --max-model-len {mml}"
    result = runner.invoke(app, ["sweep", "--serve", serve, "--chunk-budget", "32,none", "--set", "mml=8192,bogus",
                                 "--out", str(out), *RUN], terminal_width=200)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "sweep.json").read_text())
    status = {p["point"]: p["status"] for p in manifest["points"]}
    assert status == {"b32-mml-8192": "ok", "b32-mml-bogus": "failed", "unchunked-mml-8192": "ok",
                      "unchunked-mml-bogus": "failed"}
    failed = next(p for p in manifest["points"] if p["point"] == "b32-mml-bogus")
    assert "exited with code" in failed["reason"]
    assert "--max-model-len" in (out / failed["server_log"]).read_text(), "the log says why it failed"
    for point, budget in (("b32-mml-8192", "32"), ("unchunked-mml-8192", "none")):
        doc = json.loads((out / point / "run.json").read_text())
        cmd = doc["sweep"]["serve_command"]
        assert f"--chunk-budget {budget} --max-model-len 8192" in cmd and "{port}" not in cmd
        assert doc["config"]["endpoint"].startswith("http://127.0.0.1:")
        assert str(doc["config"]["endpoint"]).split(":")[2].split("/")[0] in cmd, "the run used the port given"
        log = (out / point / "server.log").read_text()
        assert log.startswith(f"$ {cmd}")
    compare = json.loads((out / "compare.json").read_text())
    assert [r["setting"] for r in compare["rows"]] == ["budget 32, mml=8192", "unchunked, mml=8192"]
    assert len(compare["missing"]) == 2 and "mml=bogus" in compare["missing"][0]
    assert "Missing point budget 32, mml=bogus" in _flat((out / "report.md").read_text())
    assert not _alive(str(out)) and not _alive("--max-model-len bogus")


def test_a_server_that_never_becomes_healthy_is_stopped_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    marker = "time.sleep(123.25)"
    serve = f"{PY} -c 'import time; {marker}' --port {{port}} --budget {{chunk_budget}}"
    t0 = time.monotonic()
    result = runner.invoke(app, ["sweep", "--serve", serve, "--chunk-budget", "64", "--serve-timeout", "2s",
                                 "--out", str(out), *RUN], terminal_width=200)
    assert result.exit_code == 1 and "no run finished" in _flat(result.output), result.output
    assert time.monotonic() - t0 < 60
    point = json.loads((out / "sweep.json").read_text())["points"][0]
    assert point["status"] == "failed" and "did not answer /health or /v1/models within 2 s" in point["reason"]
    assert (out / "b64" / "server.log").is_file()
    assert not _alive(marker)


def _wait_for(what: str, check: object, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(("sig", "during"), [(signal.SIGTERM, "run"), (signal.SIGINT, "run"),
                                             (signal.SIGTERM, "start-up")])
def test_no_server_survives_a_signal_to_the_sweep(tmp_path: Path, sig: signal.Signals, during: str) -> None:
    """A real sweep process and its real server: signal the sweep, then look for the server among all processes."""
    out = tmp_path / "sweep"
    marker = str(out)  # the server's command line does not hold it, so mark the template instead
    if during == "run":
        serve = SIM_SERVE + " --served-model-name llama-3.1-8b --max-waiting 1001"
        marker = "--max-waiting 1001"
    else:
        serve = f"{PY} -c 'import time; time.sleep(124.5)' --port {{port}} -b {{chunk_budget}}"
        marker = "time.sleep(124.5)"
    cmd = [sys.executable, "-m", "itlbench", "sweep", "--serve", serve, "--chunk-budget", "32,none",
           "--out", str(out), *RUN[:-5], "--duration", "30", "--warmup", "0.5", "--no-live"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        _wait_for("the server", lambda: _alive(marker))
        if during == "run":
            _wait_for("the first run", lambda: (out / "b32" / "run.json").is_file() or proc.poll() is not None)
            time.sleep(1.0)
        servers = _alive(marker)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert servers, output
    psutil.wait_procs(servers, timeout=5)
    assert not _alive(marker), output
    assert not (out / "unchunked").exists(), "the sweep stopped instead of going on"
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["interrupted"] is True
    if during == "run":
        assert (out / "b32" / "server.log").is_file() and (out / "b32" / "run.json").is_file()


def test_not_even_a_killed_sweep_leaves_its_server(tmp_path: Path) -> None:
    """SIGKILL runs no cleanup: the server goes because it asked Linux to signal it when its parent dies."""
    out = tmp_path / "sweep"
    serve = SIM_SERVE + " --max-waiting 1002"
    cmd = [sys.executable, "-m", "itlbench", "sweep", "--serve", serve, "--chunk-budget", "32", "--out", str(out),
           *RUN[:-5], "--duration", "30", "--warmup", "0.5", "--no-live"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        _wait_for("the server", lambda: _alive("--max-waiting 1002"))
        servers = _alive("--max-waiting 1002")
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    gone, alive = psutil.wait_procs(servers, timeout=15)
    assert servers and not alive and not _alive("--max-waiting 1002")
