"""A hostile OpenAI-compatible server for tests: each streaming request gets the next behaviour of
`HostileConfig.modes` in turn, from a well-behaved stream to a server that lies about types, never
ends an event, answers with an HTML 5xx page, trickles bytes, sends `choices: null` or cuts a chunk
in half. Non-streaming requests (the client's probes) are served properly (`OpenAIPeer`).

Modes:
  sane              a well-formed stream; `id` is "sane-<n>"
  wrong_types       `id` a number, `finish_reason` a number, usage counts a string, a negative, 1e30
  null_choices      every chunk has `choices: null` (no tokens), then [DONE]
  choices_not_list  `choices` is an object
  html_5xx          503 with an HTML page
  never_ending      `data: ` and then bytes without end, no line break ever (until the client leaves)
  trickle           a well-formed stream written a few bytes at a time
  cut_mid_chunk     three chunks, half of a fourth, then the connection is cut
  huge_usage        a usage chunk with 2**70 tokens and a string that is megabytes long
  huge_head         a response head of 200 KiB (one endless header line)

`control` makes `GET /v1/models` misbehave: "huge" (a 16 MiB reply), "trickle" (a byte every 50 ms),
"odd" (`data` a list of numbers, `max_model_len` a string); "sane" (the default) answers properly.

`GET /_log` returns what was sent: per request its mode, the `id` it carried and how many content
chunks were fully written, so a test can check that each sane request's rows are intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from itlbench.testing.openai_peer import OpenAIPeer, PeerConfig, serve_in_thread

MODES = ("sane", "wrong_types", "null_choices", "choices_not_list", "html_5xx", "never_ending", "trickle",
         "cut_mid_chunk", "huge_usage", "huge_head")


@dataclass
class HostileConfig(PeerConfig):
    modes: tuple[str, ...] = MODES
    endless_piece: int = 64 * 1024  # bytes per write of a never-ending event
    endless_limit: int = 1 << 30  # the server gives up after this many bytes of it (a test's safety net)
    trickle_s: float = 0.0005  # between pieces of a trickled stream
    trickle_piece: int = 5  # bytes per write of a trickled stream (events and HTTP chunks split anywhere)
    control: str = "sane"  # how GET /v1/models answers: sane | huge | trickle | odd


@dataclass
class _Sent:
    mode: str
    id: object
    chunks: int = 0  # content chunks fully written
    bytes: int = 0


@dataclass
class _Log:
    sent: list[_Sent] = field(default_factory=list)


class HostilePeer(OpenAIPeer):
    def __init__(self, cfg: HostileConfig | None = None) -> None:
        super().__init__(cfg or HostileConfig())
        self.hcfg: HostileConfig = self.cfg  # type: ignore[assignment]
        bad = [m for m in self.hcfg.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown modes {bad}; known: {MODES}")
        self.log = _Log()

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/_log", self._log)
        return app

    async def _models(self, request: web.Request) -> web.StreamResponse:
        mode = self.hcfg.control
        if mode == "huge":
            return web.json_response({"object": "list", "data": [], "pad": "z" * (16 << 20)})
        if mode == "odd":
            return web.json_response({"object": "list", "data": [1, 2], "max_model_len": "lots"})
        if mode == "trickle":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                for b in b'{"object": "list", "data": []}' * 1000:
                    await resp.write(bytes([b]))
                    await asyncio.sleep(0.05)
            return resp
        return await super()._models(request)

    async def _log(self, request: web.Request) -> web.Response:
        return web.json_response({"sent": [vars(s) for s in self.log.sent]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not isinstance(body, dict) or not body.get("stream"):
            return await super()._generate(request)
        n = len(self.log.sent)
        mode = self.hcfg.modes[n % len(self.hcfg.modes)]
        sent = _Sent(mode, n + 1000 if mode == "wrong_types" else f"{mode}-{n}")
        self.log.sent.append(sent)
        if mode == "html_5xx":
            return web.Response(status=503, text="<html><body><h1>503 Service Unavailable</h1></body></html>",
                                content_type="text/html")
        headers = {"Content-Type": "text/event-stream"}
        if mode == "huge_head":
            headers["X-Padding"] = "p" * (200 << 10)
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        n_out = int(body.get("max_tokens") or 16)
        chat = request.path.endswith("/chat/completions")
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError, RuntimeError):
            await self._hostile(resp, request, sent, chat, n_out)
        return resp

    async def _write(self, resp: web.StreamResponse, sent: _Sent, data: bytes) -> None:
        if sent.mode == "trickle":
            step = self.hcfg.trickle_piece
            for i in range(0, len(data), step):
                await resp.write(data[i:i + step])
                await asyncio.sleep(self.hcfg.trickle_s)
        else:
            await resp.write(data)
        sent.bytes += len(data)

    async def _hostile(self, resp: web.StreamResponse, request: web.Request, sent: _Sent, chat: bool,
                       n_out: int) -> None:
        mode, obj = sent.mode, "chat.completion.chunk" if chat else "text_completion"
        if mode == "never_ending":
            await resp.write(b"data: ")
            piece = b"x" * self.hcfg.endless_piece
            while sent.bytes < self.hcfg.endless_limit:
                await resp.write(piece)
                sent.bytes += len(piece)
                await asyncio.sleep(0)
            return
        for i in range(n_out):
            await asyncio.sleep(self.cfg.tick_s)
            last = i == n_out - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": ("length" if last else None)}
            choice.update({"delta": {"content": " x"}} if chat else {"text": " x"})
            chunk: dict[str, Any] = {"id": sent.id, "object": obj, "model": self.cfg.model, "choices": [choice]}
            if mode == "wrong_types" and last:
                choice["finish_reason"] = 7
            if mode == "null_choices":
                chunk["choices"] = None
            if mode == "choices_not_list":
                chunk["choices"] = choice
            if mode == "cut_mid_chunk" and i == 3:
                data = _sse(chunk)
                await resp.write(data[: len(data) // 2])
                if request.transport is not None:
                    request.transport.abort()
                return
            await self._write(resp, sent, _sse(chunk))
            if mode not in ("null_choices", "choices_not_list"):
                sent.chunks += 1
        usage: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": n_out, "total_tokens": 7 + n_out}
        if mode == "wrong_types":
            usage = {"prompt_tokens": "7", "completion_tokens": -3, "prompt_tokens_details": {"cached_tokens": 1e30}}
        if mode == "huge_usage":
            usage = {"prompt_tokens": 2**70, "completion_tokens": n_out, "note": "y" * (2 << 20)}
        await self._write(resp, sent, _sse({"id": sent.id, "object": obj, "choices": [], "usage": usage}))
        await self._write(resp, sent, b"data: [DONE]\n\n")
        await resp.write_eof()


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@contextlib.contextmanager
def serve_hostile(cfg: HostileConfig | None = None) -> Iterator[tuple[HostilePeer, str]]:
    """Run a hostile peer on its own event loop in a thread; yields (peer, base_url ending in /v1)."""
    with serve_in_thread(cfg or HostileConfig(), HostilePeer) as (peer, url):
        assert isinstance(peer, HostilePeer)
        yield peer, url
