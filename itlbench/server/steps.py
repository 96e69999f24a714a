"""`GET /v1/steps`: the engine's step log as NDJSON, so a remote harness can attribute stalls.

`since=N` starts at step N (records already evicted from the bounded log are skipped);
`follow=1` (the default) keeps the response open and streams new steps as they happen until the
client disconnects or the server stops; `follow=0` returns what exists and ends.

The log holds up to 200,000 records; serialising them all at once on the event loop stalled every
token stream for seconds (20,000 records took 0.9 s). So the records go out in pages of `PAGE`,
each fetched and serialised in a worker thread, each written (and drained: a slow reader holds
back only its own response) before the next; and at most `MAX_FOLLOWERS` responses stream at
once (more get a 503 naming the limit).
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from itlbench.core.steps import StepLog
from itlbench.server.guard import client_gone_quietly
from itlbench.server.protocol import ApiError
from itlbench.serving.client import EngineClient

_POLL_S = 1.0  # wake at least this often to notice shutdown
PAGE = 2000  # records per write (~1 MB of NDJSON, ~20 ms to serialise, off the loop)
MAX_FOLLOWERS = 8  # concurrent /v1/steps responses
STEPS_FOLLOWERS: web.AppKey[list[int]] = web.AppKey("itlbench_steps_followers", list)  # [count], set by build_app
STEPS_STOPPING: web.AppKey[asyncio.Event] = web.AppKey("itlbench_steps_stopping", asyncio.Event)


def install_steps(app: web.Application) -> None:
    """The followers' counter, and their end when the server stops: aiohttp waits up to 60 s for open
    responses before it closes, and a follower never ends on its own."""
    app[STEPS_FOLLOWERS] = [0]
    app[STEPS_STOPPING] = asyncio.Event()

    async def stop_followers(app: web.Application) -> None:
        app[STEPS_STOPPING].set()

    app.on_shutdown.append(stop_followers)


def _query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, f"{name}: must be an integer, got {raw!r}", name) from None


def _query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, f"{name}: must be 0 or 1, got {raw!r}", name)


def _page(step_log: StepLog, step: int) -> tuple[bytes, int | None]:
    """(NDJSON of up to PAGE records from `step`, the last one's step or None): run in a thread."""
    records = step_log.since(step, PAGE)
    if not records:
        return b"", None
    lines = "".join(json.dumps(r.to_dict(), separators=(",", ":")) + "\n" for r in records)
    return lines.encode(), records[-1].step


async def stream_steps(request: web.Request, engine: EngineClient) -> web.StreamResponse:
    since = max(0, _query_int(request, "since", 0))
    follow = _query_bool(request, "follow", True)
    followers = request.app.get(STEPS_FOLLOWERS)
    if followers is None:  # an app that did not set the counter up: count per response only
        followers = [0]
    if followers[0] >= MAX_FOLLOWERS:
        raise ApiError(503, f"{MAX_FOLLOWERS} step followers are connected already; close one and retry",
                       "steps_followers")
    followers[0] += 1
    try:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
        with client_gone_quietly():  # a follower that leaves is no error
            await resp.prepare(request)
            await _write_steps(resp, engine, since, follow, request.app.get(STEPS_STOPPING) or asyncio.Event())
        return resp
    finally:
        followers[0] -= 1


async def _write_steps(resp: web.StreamResponse, engine: EngineClient, since: int, follow: bool,
                       stopping: asyncio.Event) -> None:
    """Pages of step records from `since`; with `follow`, new ones as they come, while the engine and
    the server live."""
    step_log = engine.engine.step_log
    next_step = since
    while True:
        data, last = await asyncio.to_thread(_page, step_log, next_step)
        if last is not None:
            await resp.write(data)
            next_step = last + 1
            continue  # more may be held already: the next page before any wait
        if not follow or not engine.is_alive or stopping.is_set():
            break
        await engine.wait_for_step(next_step, _POLL_S)
    await resp.write_eof()
