"""Many concurrent streaming completions against a server, each checked against the protocol.

Used by the many-streams test and `benchmarks/soak.py`: every stream must answer 200 with
`text/event-stream`, carry well-formed `data:` JSON events with one id and the requested token
count, end with a `finish_reason` of "length" and then `data: [DONE]`. Streams picked to hang up
early read a few events and close the connection (the server must abort them and free their KV
blocks). Anything else is a protocol error, reported with the stream's index.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np


@dataclass
class BurstResult:
    streams: int
    completed: int = 0  # streams that ran to [DONE] and passed every check
    hung_up: int = 0  # streams this client closed early on purpose
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and self.completed + self.hung_up == self.streams


async def _one(session: aiohttp.ClientSession, url: str, body: dict, index: int, hang_up_after: int | None,
               result: BurstResult) -> None:
    want = body["max_tokens"]
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                result.errors.append(f"stream {index}: HTTP {resp.status} {(await resp.text())[:200]}")
                return
            if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                result.errors.append(f"stream {index}: Content-Type {resp.headers.get('Content-Type')!r}")
                return
            ids, tokens, finish, done, events = set(), 0, None, False, 0
            async for raw in resp.content:
                line = raw.strip()
                if not line:
                    continue
                if not line.startswith(b"data: "):
                    result.errors.append(f"stream {index}: not an SSE data line: {line[:80]!r}")
                    return
                payload = line[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                if done:
                    result.errors.append(f"stream {index}: data after [DONE]")
                    return
                event = json.loads(payload)
                if "error" in event:
                    result.errors.append(f"stream {index}: error event {event['error']}")
                    return
                ids.add(event["id"])
                choice = event["choices"][0]
                tokens += len(choice.get("token_ids") or [])
                finish = choice.get("finish_reason") or finish
                events += 1
                if hang_up_after is not None and events >= hang_up_after:
                    result.hung_up += 1
                    result.tokens += tokens
                    return  # leaving the context manager closes the connection mid-stream
            result.tokens += tokens
            if not done:
                result.errors.append(f"stream {index}: ended without [DONE]")
            elif len(ids) != 1:
                result.errors.append(f"stream {index}: {len(ids)} different ids")
            elif tokens != want or finish != "length":
                result.errors.append(f"stream {index}: {tokens} tokens, finish {finish!r}; wanted {want}, 'length'")
            else:
                result.completed += 1
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, KeyError) as exc:
        result.errors.append(f"stream {index}: {type(exc).__name__}: {exc}")


HANG_UP_TOKENS = 256  # what a stream that will hang up asks for: still generating when its abort lands


async def burst(base_url: str, model: str, streams: int, max_tokens: int, prompt_tokens: int, vocab: int,
                hang_up_every: int = 0, seed: int = 0, timeout_s: float = 600.0) -> BurstResult:
    """Open `streams` streaming completions at once (token-id prompts of `prompt_tokens`, exactly
    `max_tokens` out); every `hang_up_every`-th stream asks for HANG_UP_TOKENS and closes after its
    first event, so the server must abort it (with `max_tokens` a fast engine finishes it first)."""
    rng = np.random.default_rng(seed)
    result = BurstResult(streams)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    url = f"{base_url}/completions"
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for i in range(streams):
            hang = 1 if hang_up_every and i % hang_up_every == hang_up_every - 1 else None
            body = {"model": model, "prompt": rng.integers(3, vocab, prompt_tokens).tolist(),
                    "max_tokens": max_tokens if hang is None else max(max_tokens, HANG_UP_TOKENS),
                    "ignore_eos": True, "stream": True, "temperature": 0}
            tasks.append(_one(session, url, body, i, hang, result))
        await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - start
    return result
