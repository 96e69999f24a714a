"""A run stopped by a signal keeps its records and exits as the shell reports that signal: 130 for Ctrl-C
(SIGINT), 143 for SIGTERM, so a script or job runner never mistakes it for a completed run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from itlbench.cli.app import ended_early_code
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread


def _run_until_measuring(url: str, out: Path) -> subprocess.Popen[bytes]:
    """`itlbench run` against the peer, returned once its run.json shows the run under way."""
    cmd = [sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer", "--workload", "chat-short",
           "--streams", "2", "--duration", "30s", "--warmup", "0", "--no-live", "--no-report", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (out / "run.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # some requests recorded
    return proc


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_keeps_its_records_and_exits_128_plus_its_number(tmp_path: Path, sig: int,
                                                                                 code: int) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.01)) as (_, url):
        proc = _run_until_measuring(url, tmp_path / "run")
        proc.send_signal(sig)
        output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == code, output
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    assert doc["interrupted"] is True and doc["signal"] == signal.Signals(sig).name
    assert doc["stop_reason"] == "interrupted"
    words = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else "SIGTERM"
    assert f"Cut short: it was stopped by {words};" in " ".join(output.split()) and "Traceback" not in output
    assert list((tmp_path / "run").glob("requests*"))


@pytest.mark.parametrize(("doc", "code"), [({"interrupted": True, "signal": "SIGINT"}, 130),
                                           ({"interrupted": True, "signal": "SIGTERM"}, 143),
                                           ({"interrupted": True}, 130), ({"stop_reason": "interrupted"}, 130),
                                           ({"stop_reason": "completed"}, 0)])
def test_ended_early_code_names_the_signal(tmp_path: Path, doc: dict[str, object], code: int) -> None:
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert ended_early_code(tmp_path) == code


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_virtual_clock_run_as_a_served_one(tmp_path: Path, sig: int, code: int) -> None:
    """A simulated run on the virtual clock: SIGTERM killed it, leaving parts but no run.json (`analyze` refused
    the directory), and Ctrl-C was 'stopped by a signal' without naming it."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "itlbench", "run", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
           "--duration", "1h", "--no-live", "--no-report", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not list(out.glob("requests/*.parquet")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(sig)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == code, output
    doc = json.loads((out / "run.json").read_text())
    assert doc["interrupted"] is True and doc["signal"] == signal.Signals(sig).name
    assert doc["stop_reason"] == "interrupted" and (out / "summary.json").is_file()
    words = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else "SIGTERM"
    assert f"Cut short: it was stopped by {words};" in " ".join(output.split()) and "Traceback" not in output
