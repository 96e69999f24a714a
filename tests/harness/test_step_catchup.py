"""The wait for an engine's step log before a run's (or `phases`') records close: the engine's last step
against the follower's position, not step times (a tiny model's whole batch fits inside any slack)."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from aiohttp import web

from itlbench.harness.step_catchup import start_step, until_caught_up


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


# ---- where a run's share of the log begins ------------------------------------------------------------

def _start(reply: Any) -> int:
    async def main() -> int:
        runner, url = await _engine(reply)
        try:
            return await start_step(url, None)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_a_run_follows_from_the_engines_next_step_or_from_0_where_it_does_not_say() -> None:
    assert _start({"last_step": 9}) == 10
    assert _start({"last_step": -1}) == 0  # no step run yet
    for reply in ({"last_step": "many"}, {"last_step": None}, {}, [1, 2]):
        assert _start(reply) == 0, reply


def test_a_second_run_against_a_served_engine_holds_only_its_own_steps(tmp_path: Path) -> None:
    """Before: each run followed from step 0, so the second run fetched the first's steps as well (a served
    engine keeps 200,000), and reported the longest of them as its own longest step."""
    from itlbench.harness.bundled_server import BundledServer
    from itlbench.harness.orchestrate import run_load_test
    from itlbench.harness.run_config import RunConfig
    from itlbench.rundir.reader import read_table
    from tests.support.servers import TINY_ENGINE

    def run(out: Path, url: str) -> pl.DataFrame:
        cfg = RunConfig(endpoint=url, model="tiny", workload="chat-short", streams=2, duration_s=1.0, warmup_s=0.0,
                        drain_timeout_s=20.0, request_timeout_s=20.0, out=out)
        run_load_test(cfg)
        return read_table(out, "steps")

    with BundledServer(TINY_ENGINE, tmp_path / "server.log") as srv:
        first = run(tmp_path / "a", srv.base_url)
        second = run(tmp_path / "b", srv.base_url)
    assert first.height > 0 and second.height > 0
    assert second["step"].min() > first["step"].max()
    assert second["step"].is_unique().all() and (second["step"].diff().drop_nulls() == 1).all()
