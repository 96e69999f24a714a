"""`itlbench serve` on loopback with an engine fault injected (`FAULT_ENV`), in each serving layout, for the tests
of how a server's engine dies (test_engine_crash.py, test_failed_steps.py): start it and wait for /health, read a
stream's events to [DONE]; and the simulator's engine for the same tests embedded (`BackgroundServer`)."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from itlbench.core.engine_config import EngineConfig
from itlbench.harness.bundled_server import free_port
from itlbench.serving.fault_hook import FAULT_ENV

# the simulator in the server's own process; SERVE["sim"] is the same engine on the command line
SIM = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192, sim_time_scale=4.0)
SERVE = {
    "sim": ["--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192",
            "--sim-time-scale", "4"],
    "no-engine-process": ["--model", "tiny", "--device", "cpu", "--max-model-len", "4096", "--no-engine-process",
                          "--torch-threads", "1"],
    "engine-process": ["--model", "tiny", "--device", "cpu", "--max-model-len", "4096", "--torch-threads", "1"],
}


def model_of(layout: str) -> str:
    """The model name a request to a server started with SERVE[layout] gives."""
    return "llama-3.1-8b" if layout == "sim" else "tiny"


@contextlib.contextmanager
def serving(layout: str, fault: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`itlbench serve` with SERVE[layout] and FAULT_ENV=`fault`, healthy: its process (stdout and stderr piped)
    and port. A server still running at the end is killed with its process group (its engine process too)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "itlbench", "serve", "--port", str(port), *SERVE[layout]],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, FAULT_ENV: fault})
    try:
        wait_healthy(proc, port)
        yield proc, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def wait_healthy(proc: subprocess.Popen[str], port: int, timeout_s: float = 60) -> None:
    """Until /health answers 200; a server that exits first fails the test with its stderr."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)


def read_events(resp: http.client.HTTPResponse) -> list[str]:
    """A streamed response's `data:` payloads up to and including [DONE]; a stream cut before it fails the test."""
    got: list[str] = []
    while not got or got[-1] != "[DONE]":
        line = resp.readline()
        assert line, f"the stream was cut after {got[-2:]}"
        if line.strip():
            got.append(line.decode().strip().removeprefix("data: "))
    return got
