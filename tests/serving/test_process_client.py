"""How the engine-process client tells of its engine's death: in one sentence (a signal by name, an exit code, or
what the engine said it died of), the same for a request it refuses, the streams it fails, /health and the exit
line (`EngineProcessClient.why_not_alive`); and a shutdown, in that same sentence, for the streams it cuts."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from itlbench.core.request import SamplingParams
from itlbench.serving.client import SHUT_DOWN, EngineDeadError
from itlbench.serving.fault_hook import FAULT_ENV
from itlbench.serving.process_client import EngineProcessClient, describe_exit
from tests.support.servers import PROCESS_ENGINE

FAULT_STEP = 20


def test_an_exit_names_the_signal_or_the_code():
    assert describe_exit(7, -signal.SIGKILL) == "the engine process (pid 7) was killed by SIGKILL"
    assert describe_exit(7, -200) == "the engine process (pid 7) was killed by signal 200"
    assert describe_exit(7, 3) == "the engine process (pid 7) exited with code 3"
    assert describe_exit(7, None) == "the engine process (pid 7) closed its connection"


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="waits on the engine process without reaping it")
@pytest.mark.parametrize("how", ["exception", "SIGKILL"])
def test_a_request_arriving_as_the_engine_process_dies_hears_how_it_died(monkeypatch: pytest.MonkeyPatch, how: str):
    """The engine process can be reaped (`is_alive` polls it) before the event loop has read what it said on its
    way out. Holding the loop until the process has exited opens that window for certain: a request arriving in
    it was told only "exited with code 2", not the exception the engine loop died of."""
    if how == "exception":
        monkeypatch.setenv(FAULT_ENV, str(FAULT_STEP))
    else:
        monkeypatch.delenv(FAULT_ENV, raising=False)

    async def scenario() -> tuple[int, list[str]]:
        client = await EngineProcessClient(PROCESS_ENGINE, 1).start()
        pid = client.pid
        assert pid is not None
        try:
            stream = await client.add([5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True))
            if how == "SIGKILL":
                os.kill(pid, signal.SIGKILL)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # blocks the loop: the reader reads nothing meanwhile
            assert not client.is_alive and client.error is None  # reaped, its last words unread: the window
            with pytest.raises(EngineDeadError) as refused:
                await client.add([1, 2], SamplingParams(max_tokens=2))
            said = await client.why_not_alive()
            with pytest.raises(EngineDeadError) as failed:
                async for _ in stream:
                    pass
            return pid, [str(refused.value), said, str(failed.value), str(client.error)]
        finally:
            client.shutdown()

    pid, told = asyncio.run(asyncio.wait_for(scenario(), 120))
    expected = (f"the engine stopped: RuntimeError: injected engine fault at step {FAULT_STEP}" if how == "exception"
                else f"the engine process (pid {pid}) was killed by SIGKILL")
    assert told == [expected] * 4


def test_a_stream_cut_by_a_shutdown_ends_in_the_words_a_refused_request_hears(monkeypatch: pytest.MonkeyPatch):
    """A shutdown is no death: the stream it cuts says so in `why_not_alive`'s sentence (it said "engine stopped:
    shutdown" while a request refused meanwhile heard that the server is stopping)."""
    monkeypatch.delenv(FAULT_ENV, raising=False)

    async def scenario() -> list[str]:
        client = await EngineProcessClient(PROCESS_ENGINE, 1).start()
        try:
            stream = await client.add([5, 6, 7], SamplingParams(max_tokens=1000, ignore_eos=True))
            await asyncio.to_thread(client.shutdown)
            with pytest.raises(EngineDeadError) as cut:
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError) as refused:
                await client.add([1, 2], SamplingParams(max_tokens=2))
            return [str(cut.value), str(refused.value), await client.why_not_alive(), str(client.error)]
        finally:
            client.shutdown()

    assert asyncio.run(asyncio.wait_for(scenario(), 120)) == [SHUT_DOWN] * 3 + ["None"]
