"""The wait for an engine's step log before a run's (or `phases`') records close: the engine's last step
against the follower's position, not step times (a tiny model's whole batch fits inside any slack)."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from itlbench.harness.step_catchup import until_caught_up


@dataclass
class _Follower:
    next_step: int


async def _engine(reply: Any) -> tuple[web.AppRunner, str]:
    """A loopback peer answering /engine with `reply` (a test peer standing in for the engine's info)."""
    async def engine_info(request: web.Request) -> web.Response:
        return web.json_response(reply)

    app = web.Application()
    app.router.add_get("/engine", engine_info)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _waited(reply: Any, follower: _Follower, timeout_s: float, advance_to: int | None = None) -> float:
    async def main() -> float:
        runner, url = await _engine(reply)
        try:
            async def advance() -> None:
                await asyncio.sleep(0.2)
                if advance_to is not None:
                    follower.next_step = advance_to
            task = asyncio.create_task(advance())
            t0 = time.monotonic()
            await until_caught_up(follower, url, None, timeout_s)
            waited = time.monotonic() - t0
            await task
            return waited
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_it_waits_until_the_follower_holds_the_engines_last_step() -> None:
    follower = _Follower(next_step=4)  # steps 0-3 read; the engine has run 0-9
    assert 0.15 < _waited({"last_step": 9}, follower, timeout_s=5.0, advance_to=10) < 2.0
    assert _waited({"last_step": 9}, _Follower(next_step=10), timeout_s=5.0) < 0.15  # already there


def test_a_log_that_never_catches_up_costs_the_timeout_not_a_hang() -> None:
    assert 0.3 <= _waited({"last_step": 99}, _Follower(next_step=0), timeout_s=0.3) < 2.0


def test_an_engine_gone_or_answering_without_a_step_number_is_not_waited_for() -> None:
    for reply in ({"last_step": "many"}, {"last_step": None}, {}):
        assert _waited(reply, _Follower(next_step=0), timeout_s=5.0) < 0.5, reply
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    asyncio.run(until_caught_up(_Follower(next_step=0), f"http://127.0.0.1:{port}", None, 5.0))
    assert time.monotonic() - t0 < 2.0
