"""SIGTERM for the engine process alone is obeyed within about a second: the streams in flight end with an
error naming it, after the tokens already sent, and `itlbench serve` exits non-zero saying so; the same
signal to the whole process group still drains the streams in flight (it once waited 80 s either way)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.harness.bundled_server import free_port, server_command

# cpu-small decodes a few hundred tokens a second on one thread: a 6,000-token answer outlasts every signal here
ENGINE = EngineConfig(model="cpu-small", device="cpu", max_model_len=8192, torch_threads=1, seed=0)


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    port = free_port()
    proc = subprocess.Popen(server_command(ENGINE, "127.0.0.1", port), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        yield proc, port, _engine_pid(proc, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def _engine_pid(proc: subprocess.Popen[str], port: int) -> int:
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, "the server exited while starting"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/engine", timeout=2) as resp:
                return int(json.loads(resp.read())["serving"]["engine_pid"])
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


class _Stream:
    """One streamed completion, read event by event."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": "cpu-small", "prompt": [5, 6, 7], "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        self.events: list[str] = []

    def read(self, n: int | None = None) -> list[str]:
        """The next `n` data events (all to [DONE] when None)."""
        got: list[str] = []
        while n is None or len(got) < n:
            line = self.resp.readline().decode().strip()
            if not line:
                assert not self.resp.isclosed(), "the stream was cut"
                continue
            got.append(line.removeprefix("data: "))
            if got[-1] == "[DONE]":
                break
        self.events += got
        return got


def _tokens(events: list[str]) -> int:
    return sum(len(json.loads(e)["choices"][0]["token_ids"]) for e in events if '"choices"' in e)


def test_sigterm_to_the_engine_alone_fails_streams_and_stops_the_server_at_once(served):
    proc, port, engine_pid = served
    stream = _Stream(port, 6000)
    before = _tokens(stream.read(20))
    t0 = time.monotonic()
    os.kill(engine_pid, signal.SIGTERM)
    rest = stream.read()
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert elapsed < 10, f"{elapsed:.1f} s"  # 80 s before: the engine ignored it until its own grace ran out
    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])["error"]
    assert error["code"] == "engine_error"
    assert f"the engine process (pid {engine_pid}) was killed by SIGTERM" in error["message"]
    assert before == 20 and _tokens(rest) < 6000 - 20  # what was sent stays sent; the rest never came
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert lines[-1] == f"error: the engine process (pid {engine_pid}) was killed by SIGTERM; the server stopped", err
    assert "Traceback" not in err


def test_sigkill_to_the_engine_stops_the_server_in_the_words_of_health(served):
    """The exit line and /health's error (test_server_engine_process.py) are one sentence: a SIGKILL could
    leave /health saying `None` while the server's last line named the signal."""
    proc, _, engine_pid = served
    os.kill(engine_pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert lines[-1] == f"error: the engine process (pid {engine_pid}) was killed by SIGKILL; the server stopped", err
    assert "Traceback" not in err


def test_sigterm_to_the_whole_group_still_drains_the_streams_in_flight(served):
    proc, port, _ = served
    stream = _Stream(port, 3000)
    before = _tokens(stream.read(20))
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    rest = stream.read()
    finished = time.monotonic() - t0
    _, err = proc.communicate(timeout=90)
    assert rest[-1] == "[DONE]" and '"error"' not in "".join(rest), rest[-3:]
    assert before + _tokens(rest) == 3000
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "length"
    assert finished > 1.5, "the stream ended before the engine's one-second decision: nothing was tested"
    assert proc.returncode == 0, err
    assert "ERROR" not in err and "killed by" not in err, err
