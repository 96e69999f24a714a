"""Follow the bundled engine's step log (`GET {base}/v1/steps?since=N`, NDJSON) into the `steps` table.

The stream stays open while the engine runs; on any error or end of stream the follower reconnects
with `since = last step + 1`, so no step is written twice. It ends only when cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

from itlbench.load.sink import RowWriter
from itlbench.rundir.schema import coerce_row


def step_row(d: object) -> dict[str, object] | None:
    """A step line as a `steps` row, its values coerced (the server is untrusted); None: not a step."""
    row = coerce_row("steps", d)
    if row is None or row["step"] is None:
        return None
    row["prefill_request_ids"] = row["prefill_request_ids"] or []
    return row


class StepsFollower:
    """Reads steps into a writer; `next_step` is where a reconnect resumes."""

    def __init__(self, base_url: str, writer: RowWriter, *, retry_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/steps"
        self.writer = writer
        self.retry_s = retry_s
        self.next_step = 0
        self.rows = 0
        self.reconnects = 0
        self.bad_lines = 0  # lines that were not a step object with a non-negative integer `step`

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
                    await self._follow_once(session)
                self.reconnects += 1
                await asyncio.sleep(self.retry_s)

    async def _follow_once(self, session: aiohttp.ClientSession) -> None:
        async with session.get(self.url, params={"since": str(self.next_step)}) as resp:
            resp.raise_for_status()
            async for line in resp.content:
                if line.strip():
                    self._on_line(line)

    def _on_line(self, line: bytes) -> None:
        try:
            row = step_row(json.loads(line))
        except ValueError:
            row = None
        if row is None:
            self.bad_lines += 1
            return
        step = int(row["step"])  # type: ignore[call-overload]
        if step < self.next_step:  # a server that ignored `since`
            return
        self.writer.add("steps", row)
        self.next_step = step + 1
        self.rows += 1
