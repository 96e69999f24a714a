"""What only the engine-process layout has: the engine in another process, a front end without torch,
the core's exit, and its aborts (the server tests run against both layouts: conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from itlbench.core.request import SamplingParams
from itlbench.engine.cpu import native
from itlbench.harness.bundled_server import free_port, server_command
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.serving.async_engine import EngineDeadError
from itlbench.system.threads import serving_threads
from tests.support.servers import PROCESS_ENGINE, TINY_ENGINE


def _engine_info(srv) -> dict:
    with urllib.request.urlopen(f"{srv.base_url}/engine", timeout=10) as resp:
        return json.loads(resp.read())


def test_engine_runs_in_another_process(process_server):
    server = process_server
    serving = _engine_info(server)["serving"]
    assert serving["engine_process"] is True and serving["torch_threads"] == 1
    # the layout the engine process chose, reported across: panels for the native product on CPU fp32
    assert serving["weight_layout"] == ("panels" if native.load() is not None else "row-major")
    assert serving["engine_pid"] != os.getpid()
    assert serving["engine_gc_frozen_objects"] > 50_000  # torch and the model, out of the collector's reach
    assert "gc_frozen_objects" not in serving  # an embedded front end leaves its host process's heap alone
    assert server.server.engine.is_alive


def test_engine_info_says_where_the_engine_runs_and_on_how_many_threads(server):
    info = _engine_info(server)
    serving, config = info["serving"], info["engine"]
    assert config["engine_process"] is serving["engine_process"]
    assert config["torch_threads"] == serving["torch_threads"]
    if serving["engine_process"]:
        assert serving["engine_pid"] == server.server.engine.pid != os.getpid()
        assert serving["torch_threads"] == 1  # PROCESS_ENGINE's, as torch in the engine process reports it
    else:
        assert serving["torch_threads"] == torch.get_num_threads()  # the engine thread shares this process's torch


def test_admission_errors_cross_the_process_boundary(process_server):
    server = process_server
    driver = server.server.engine

    async def scenario() -> None:
        with pytest.raises(ValueError, match="max_tokens"):
            await driver.add([5] * 500, SamplingParams(max_tokens=900))
        outs = [o async for o in driver.generate([5, 6], SamplingParams(max_tokens=3, ignore_eos=True))]
        assert [len(o.new_token_ids) for o in outs] == [1, 1, 1] and outs[-1].finish_reason == "length"

    asyncio.run_coroutine_threadsafe(scenario(), server._loop).result(30)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_engine_fails_requests_and_health(sig: signal.Signals):
    with BackgroundServer(ServerConfig(engine=PROCESS_ENGINE, port=0)) as srv:
        driver = srv.server.engine

        async def start_long():
            return await driver.add([7, 8, 9], SamplingParams(max_tokens=900, ignore_eos=True))

        stream = asyncio.run_coroutine_threadsafe(start_long(), srv._loop).result(30)
        pid = driver.pid
        t0 = time.monotonic()
        os.kill(pid, sig)  # SIGTERM to it alone, the server not stopping: obeyed within a second

        async def drain():
            async for _ in stream:
                pass

        with pytest.raises(EngineDeadError, match=rf"the engine process \(pid {pid}\) was killed by {sig.name}"):
            asyncio.run_coroutine_threadsafe(drain(), srv._loop).result(30)
        dead = asyncio.run_coroutine_threadsafe(driver.wait_dead(), srv._loop).result(5)
        assert dead is driver.error and time.monotonic() - t0 < 10
        assert not driver.is_alive
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{srv.url}/health", timeout=10)
        # the sentence `itlbench serve` exits with (test_engine_sigterm.py), not the exception's repr
        assert info.value.code == 503 and json.loads(info.value.read()) == {
            "status": "error", "error": f"the engine process (pid {pid}) was killed by {sig.name}"}


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_command_line_server_front_end_without_torch_and_clean_exit():
    port = free_port()
    cmd = server_command(TINY_ENGINE, "127.0.0.1", port)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/engine", timeout=2) as resp:
                    info = json.loads(resp.read())
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        engine_pid = info["serving"]["engine_pid"]
        assert info["serving"]["engine_process"] is True
        assert Path(f"/proc/{engine_pid}/stat").read_text().split()[3] == str(proc.pid)  # the server's own child
        # the configuration left both to the default: /v1/engine says what that came to, not null
        assert info["engine"]["engine_process"] is True
        assert info["engine"]["torch_threads"] == info["serving"]["torch_threads"] == serving_threads(None)
        assert "libtorch" not in _maps(proc.pid) and "libtorch" in _maps(engine_pid)
        # both processes froze their startup heaps (itlbench/heap.py): torch's is several times the front end's
        frozen_front, frozen_engine = info["serving"]["gc_frozen_objects"], info["serving"]["engine_gc_frozen_objects"]
        assert 5_000 < frozen_front < frozen_engine
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()
    assert not Path(f"/proc/{engine_pid}").exists() or "zombie" in Path(f"/proc/{engine_pid}/status").read_text()
    assert "engine_process=yes" in out.decode()
