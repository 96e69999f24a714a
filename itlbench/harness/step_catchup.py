"""Where a run's share of an itlbench engine's step log begins, and waiting for it to reach the client
before the run's records are closed.

A served engine keeps up to 200,000 steps of its history, every earlier run's included. A follower that
began at step 0 fetched all of them at the start of each run: megabytes serialised by the server under
test while the run's first requests went out, and earlier runs' steps in this run's records (the
longest of them reported as "the longest step of the run"). So a run follows from the engine's next
step (`start_step`); a step under way when the run begins is still in it.

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


async def last_step(engine_url: str, api_key: str | None) -> int | None:
    """The engine's latest finished step (`/engine`'s `last_step`, -1 before its first); None when it does not
    answer or gives no step number."""
    try:
        info = await asyncio.to_thread(request_json, f"{engine_url}/engine", None, api_key, 2.0)
        return int(info.get("last_step", -1))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


async def start_step(engine_url: str, api_key: str | None) -> int:
    """The step a run's follower begins at: the engine's next one (0 where it does not say, as before)."""
    last = await last_step(engine_url, api_key)
    return 0 if last is None else max(0, last + 1)


async def until_caught_up(follower: FollowsSteps, engine_url: str, api_key: str | None, timeout_s: float) -> None:
    """Return once `follower` holds every step the engine had run when this was called, or after `timeout_s`;
    at once when the engine does not answer (it is gone: the follower already has all it will get)."""
    last = await last_step(engine_url, api_key)
    if last is None:
        return  # gone, or a reply without a step number: nothing to wait for
    deadline = time.monotonic() + timeout_s
    while follower.next_step <= last and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
