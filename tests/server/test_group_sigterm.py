"""A stop of the whole process group (systemd's default, `timeout`) is a clean shutdown, not a dead engine,
and a /v1/steps follower does not hold the server up (aiohttp would wait 60 s for it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_then_signal_group(sig: signal.Signals) -> tuple[int, float, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "itlbench", "serve", "--model", "tiny", "--port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "itlbench serving" in line or not line:
            break
    assert "itlbench serving" in lines[-1], "".join(lines)
    follower = urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/steps?since=0", timeout=30)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert follower.read() == b""  # the follow stream ended (no steps ran), not cut
    return proc.returncode, elapsed, "".join(lines) + err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_group_signal_stops_the_server_with_a_follower_quickly_and_without_an_engine_error(sig: signal.Signals):
    code, elapsed, log = _serve_then_signal_group(sig)
    assert elapsed < 10, log
    assert "shutting down" in log
    assert "ERROR" not in log and "exited (code" not in log, log
    assert code == 0, log
