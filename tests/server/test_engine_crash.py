"""An engine that dies inside the server's own process (the simulator, `--no-engine-process`) is treated as an
engine process that dies: streams in flight end with an error naming the exception after the tokens already
sent, /health and new requests get 503, and `itlbench serve` exits 2 with one line saying why (before, it
kept serving nothing until it was stopped, and exited 0). An engine process whose loop dies names the
exception the same way (it said only its exit code)."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.serving.build import create_engine
from itlbench.serving.client import EngineDeadError, engine_stopped
from itlbench.serving.fault_hook import FAULT_ENV
from tests.support.fault_servers import SERVE, SIM, model_of, read_events, serving
from tests.support.servers import PROCESS_ENGINE

FAULT_STEP = 40
FAULT = f"RuntimeError: injected engine fault at step {FAULT_STEP}"


@pytest.mark.parametrize("layout", sorted(SERVE))
def test_serve_exits_2_naming_the_exception_after_failing_its_streams(layout: str):
    with serving(layout, str(FAULT_STEP)) as (proc, port):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = {"model": model_of(layout), "prompt": [5, 6, 7], "max_tokens": 3000, "stream": True,
                "ignore_eos": True}
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        events = read_events(resp)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
    tokens = [t for e in events[:-2] for t in json.loads(e)["choices"][0]["token_ids"]]
    assert 0 < len(tokens) < FAULT_STEP  # what the steps before the fault made was sent, and stays sent
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_error" and error["message"] == f"the engine stopped: {FAULT}"
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == f"error: the engine stopped: {FAULT}; the server stopped"
    assert "Traceback" in err and "engine loop crashed" in err  # the server's log keeps it for debugging
    assert out == ""
    assert elapsed < 10, f"{elapsed:.1f} s"


@pytest.mark.parametrize(("engine", "model"), [(SIM, "llama-3.1-8b"), (PROCESS_ENGINE, "tiny")],
                         ids=["in-process", "engine-process"])
def test_health_and_new_requests_get_503_naming_the_exception(monkeypatch: pytest.MonkeyPatch, engine: EngineConfig,
                                                              model: str):
    """Embedded (BackgroundServer) the server stays up for its owner: what a client sees there meanwhile. The engine
    process inherits the fault; its new requests were told "engine loop is not running", not the exception."""
    monkeypatch.setenv(FAULT_ENV, str(FAULT_STEP))
    with BackgroundServer(ServerConfig(engine=engine, port=0)) as srv:
        driver = srv.server.engine
        assert urllib.request.urlopen(f"{srv.url}/health", timeout=5).status == 200

        async def until_dead() -> BaseException:
            stream = await driver.add([5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True))
            with pytest.raises(EngineDeadError, match=FAULT):
                async for _ in stream:
                    pass
            return await asyncio.wait_for(driver.wait_dead(), 5)

        dead = asyncio.run_coroutine_threadsafe(until_dead(), srv._loop).result(30)
        assert dead is driver.error and str(dead) == f"the engine stopped: {FAULT}"
        assert not driver.is_alive
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(f"{srv.url}/health", timeout=5)
        assert health.value.code == 503  # the sentence the server exits with, not the exception's repr
        assert json.loads(health.value.read()) == {"status": "error", "error": f"the engine stopped: {FAULT}"}
        req = urllib.request.Request(f"{srv.url}/v1/completions", json.dumps(
            {"model": model, "prompt": [1, 2], "max_tokens": 2}).encode(), {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as new:
            urllib.request.urlopen(req, timeout=5)
        error = json.loads(new.value.read())["error"]
        assert new.value.code == 503 and error["code"] == "engine_dead" and error["message"] == f"the engine stopped: {FAULT}"


def test_the_error_is_one_line_with_the_exception_type():
    assert str(engine_stopped(ValueError("bad\n  state"))) == "the engine stopped: ValueError: bad state"
    assert str(engine_stopped(MemoryError())) == "the engine stopped: MemoryError"
    long = str(engine_stopped(RuntimeError("x" * 1000)))
    assert "\n" not in long and len(long) < 400 and long.endswith("…")


def test_the_fault_hook_does_nothing_unset_and_refuses_a_bad_value(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    engine = create_engine(SIM)
    assert "step" not in vars(engine)  # the engine's own method, unwrapped
    monkeypatch.setenv(FAULT_ENV, "soon")
    with pytest.raises(ConfigError, match=FAULT_ENV):
        create_engine(SIM)
