"""Waiting for an itlbench engine's step log to reach the client before a run's records are closed.

The client receives its last token before the step follower's stream delivers the step that produced
it, and how far the stream lags depends on the machine's load. Step times cannot tell a caught-up log
from a lagging one (a tiny model's whole batch can run inside any slack), so the engine is asked for
its last step (`/engine`'s `last_step`) and the follower's position is compared with that.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from itlbench.harness.http_json import request_json


class FollowsSteps(Protocol):
    next_step: int  # the first step the follower has not yet read


async def until_caught_up(follower: FollowsSteps, engine_url: str, api_key: str | None, timeout_s: float) -> None:
    """Return once `follower` holds every step the engine had run when this was called, or after `timeout_s`;
    at once when the engine does not answer (it is gone: the follower already has all it will get)."""
    try:
        info = await asyncio.to_thread(request_json, f"{engine_url}/engine", None, api_key, 2.0)
    except (OSError, ValueError):
        return
    try:
        last = int(info.get("last_step", -1))
    except (TypeError, ValueError):
        return  # a reply without a step number: nothing to wait for
    deadline = time.monotonic() + timeout_s
    while follower.next_step <= last and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
