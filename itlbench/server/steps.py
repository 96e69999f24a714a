"""`GET /v1/steps`: the engine's step log as NDJSON, so a remote harness can attribute stalls.

`since=N` starts at step N (records already evicted from the bounded log are skipped);
`follow=1` (the default) keeps the response open and streams new steps as they happen until the
client disconnects; `follow=0` returns what exists and ends.
"""

from __future__ import annotations

import json

from aiohttp import web

from itlbench.server.protocol import ApiError
from itlbench.serving.client import EngineClient

_POLL_S = 1.0  # wake at least this often to notice shutdown


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


async def stream_steps(request: web.Request, engine: EngineClient) -> web.StreamResponse:
    since = max(0, _query_int(request, "since", 0))
    follow = _query_bool(request, "follow", True)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    step_log = engine.engine.step_log
    next_step = since
    while True:
        records = step_log.since(next_step)
        if records:
            lines = "".join(json.dumps(r.to_dict(), separators=(",", ":")) + "\n" for r in records)
            await resp.write(lines.encode())
            next_step = records[-1].step + 1
        if not follow or not engine.is_alive:
            break
        await engine.wait_for_step(next_step, _POLL_S)
    await resp.write_eof()
    return resp
