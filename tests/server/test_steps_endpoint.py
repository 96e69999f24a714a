"""`GET /v1/steps` with a full step log: paged, serialised off the event loop (every other stream keeps
its pace), every record once and in order; and a cap on concurrent followers."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from itlbench.core.steps import StepLog, StepRecord
from itlbench.server.app import _errors  # the real app's error middleware (ApiError -> OpenAI JSON)
from itlbench.server.steps import MAX_FOLLOWERS, PAGE, STEPS_FOLLOWERS, stream_steps


@dataclass
class _Inner:
    step_log: StepLog


@dataclass
class _Engine:
    """A test peer with the three things the endpoint reads from an EngineClient."""

    engine: _Inner
    is_alive: bool = True
    waits: list[int] = field(default_factory=list)

    async def wait_for_step(self, step: int, timeout: float) -> bool:
        self.waits.append(step)
        await asyncio.sleep(min(timeout, 0.05))
        return False


def _record(i: int) -> StepRecord:
    return StepRecord(step=i, phase="decode", prefill_tokens=0, decode_tokens=32, num_prefill_reqs=0,
                      num_decode_reqs=32, num_running=32, num_waiting=0, num_preemptions=0, kv_usage=0.5,
                      token_budget=512, start_ns=i * 1000, end_ns=i * 1000 + 900,
                      prefill_request_ids=("a", "b"), num_finished=1)


def _app(engine: _Engine) -> web.Application:
    app = web.Application(middlewares=[_errors])
    app[STEPS_FOLLOWERS] = [0]

    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream_steps(request, engine)  # type: ignore[arg-type]
    app.router.add_get("/v1/steps", handler)
    return app


def test_a_full_log_streams_in_pages_without_stalling_the_loop():
    """Before: the whole log serialised in one go on the loop (20,000 records: 0.9 s)."""
    log = StepLog(capacity=200_000)
    for i in range(60_000):
        log.append(_record(i))
    engine = _Engine(_Inner(log))

    async def main() -> tuple[list[int], float, float]:
        server = TestServer(_app(engine))
        await server.start_server()
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        steps: list[int] = []
        began = time.perf_counter()
        async with ClientSession() as s, s.get(server.make_url("/v1/steps?since=0&follow=0")) as r:
            async for line in r.content:
                steps.append(json.loads(line)["step"])
        took = time.perf_counter() - began
        stop.set()
        await tick
        await server.close()
        return steps, max(gaps), took

    steps, worst_gap, took = asyncio.run(main())
    assert steps == list(range(60_000))
    # the loop's longest stall as a share of the whole read, so a slow or loaded box does not decide it:
    # serialised in one go, the log held the loop for nearly all of it
    assert worst_gap < 0.25 * took, f"the event loop stalled {worst_gap * 1e3:.0f} ms of {took * 1e3:.0f} ms"
    assert len(log.since(100, PAGE)) == PAGE and log.since(59_999, PAGE)[0].step == 59_999


def test_steps_since_a_middle_step_and_past_the_end():
    log = StepLog(capacity=100)
    for i in range(250):
        log.append(_record(i))
    assert [r.step for r in log.since(0, 5)] == [150, 151, 152, 153, 154]  # evicted ones skipped
    assert [r.step for r in log.since(200, 3)] == [200, 201, 202] and log.since(250, 3) == []
    assert [r.step for r in log.since(248)] == [248, 249]


def test_followers_beyond_the_cap_get_a_503():
    log = StepLog(capacity=10)
    log.append(_record(0))
    engine = _Engine(_Inner(log))

    async def main() -> tuple[int, dict[str, object]]:
        server = TestServer(_app(engine))
        await server.start_server()
        async with ClientSession() as s:
            open_ = [await s.get(server.make_url("/v1/steps?since=0")) for _ in range(MAX_FOLLOWERS)]
            extra = await s.get(server.make_url("/v1/steps?since=0"))
            body = await extra.json()
            for r in open_:
                r.close()
            status = extra.status
        await server.close()
        return status, body

    status, body = asyncio.run(main())
    assert status == 503 and "step followers are connected already" in body["error"]["message"]  # type: ignore[index]
