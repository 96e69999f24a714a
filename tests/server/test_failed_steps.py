"""Failed steps in a row mean a dead engine, in every layout: a failed step fails its batch and the server
carries on, but three in a row, none succeeding between them, stop it as a dead engine process does (before, an
engine failing every step kept /health at 200 while failing every request). And a dead engine process's error,
not "engine loop is not running", is what new requests are refused with (test_engine_crash.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.serving.client import EngineDeadError
from itlbench.serving.fault_hook import FAULT_ENV
from itlbench.serving.step_failures import MAX_FAILED_STEPS
from tests.support.fault_servers import SERVE, SIM, model_of, read_events, serving
from tests.support.servers import PROCESS_ENGINE

FAILED = r"engine step failed: RuntimeError\('injected engine fault at step (\d+)'\)"
DEAD = (rf"the engine stopped after {MAX_FAILED_STEPS} failed steps in a row: "
        r"RuntimeError: injected engine fault at step (\d+)")


@pytest.fixture(params=sorted(SERVE))
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def served(layout: str, request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    with serving(layout, request.param) as (proc, port):
        yield proc, port, model_of(layout)


def _generate(port: int, model: str, max_tokens: int) -> tuple[int, str | None]:
    """One streamed completion: the tokens it got, and the message of the error event that ended it (if any)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    events = [json.loads(e) for e in read_events(resp)[:-1]]
    conn.close()
    tokens = sum(len(e["choices"][0]["token_ids"]) for e in events if e.get("choices"))
    error = events[-1].get("error")
    if error is not None:
        assert error["code"] == "engine_error"
    return tokens, None if error is None else error["message"]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


def _step_of(pattern: str, message: str | None) -> int:
    match = re.fullmatch(pattern, message or "")
    assert match, message
    return int(match[1])


@pytest.mark.parametrize("served", ["40:every"], indirect=True)
def test_failed_steps_in_a_row_stop_the_server_naming_the_last_exception(served):
    proc, port, model = served
    tokens, error = _generate(port, model, 3000)
    assert 0 < tokens < 40 and _step_of(FAILED, error) == 40  # a failed step fails its batch, tokens sent stay
    assert _healthy(port)  # one failed step is no dead engine
    tokens, error = _generate(port, model, 50)
    second = _step_of(FAILED, error)
    assert tokens == 0 and second > 40 and _healthy(port)
    t0 = time.monotonic()
    tokens, error = _generate(port, model, 50)
    third = _step_of(DEAD, error)  # the third in a row: the stream ends naming the engine's death and its cause
    assert tokens == 0 and third > second
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 15
    assert proc.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert line == f"error: {error}; the server stopped", err


@pytest.mark.parametrize("served", ["40,41,100,101:once"], indirect=True)
def test_failed_steps_with_a_success_between_keep_the_server_serving(served):
    proc, port, model = served
    tokens, error = _generate(port, model, 3000)
    assert 0 < tokens < 40 and _step_of(FAILED, error) == 40
    tokens, error = _generate(port, model, 50)
    assert tokens == 0 and _step_of(FAILED, error) == 41 and _healthy(port)  # two in a row: still serving
    tokens, error = _generate(port, model, 3000)  # steps 42 to 99 succeed: the count starts again
    assert 50 < tokens < 60 and _step_of(FAILED, error) == 100
    tokens, error = _generate(port, model, 50)
    assert tokens == 0 and _step_of(FAILED, error) == 101  # four failed, never three in a row
    assert _generate(port, model, 50) == (50, None) and _healthy(port)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "the engine stopped" not in err


@pytest.mark.parametrize("engine", [SIM, PROCESS_ENGINE], ids=["in-process", "engine-process"])
def test_health_names_the_failed_steps_in_a_row(monkeypatch: pytest.MonkeyPatch, engine: EngineConfig):
    """Embedded (BackgroundServer) the server stays up: /health and a new request say, in the server's exit line's
    words, that failed steps in a row stopped the engine, and which exception the last one raised."""
    monkeypatch.setenv(FAULT_ENV, "3:every")
    with BackgroundServer(ServerConfig(engine=engine, port=0)) as srv:
        driver = srv.server.engine

        async def until_dead() -> str:
            for _ in range(MAX_FAILED_STEPS):  # each request's batch is one failed step
                stream = await driver.add([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True))
                with pytest.raises(EngineDeadError):
                    async for _ in stream:
                        pass
            await asyncio.wait_for(driver.wait_dead(), 5)
            return await driver.why_not_alive()

        said = asyncio.run_coroutine_threadsafe(until_dead(), srv._loop).result(30)
        assert said == str(driver.error) and _step_of(DEAD, said) >= 3
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(f"{srv.url}/health", timeout=5)
        assert health.value.code == 503 and json.loads(health.value.read()) == {"status": "error", "error": said}
        req = urllib.request.Request(f"{srv.url}/v1/completions", json.dumps({"prompt": [1, 2], "max_tokens": 2}).encode(),
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as new:
            urllib.request.urlopen(req, timeout=5)
        assert new.value.code == 503 and json.loads(new.value.read())["error"]["message"] == said
