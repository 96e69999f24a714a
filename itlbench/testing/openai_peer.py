"""A stand-in external engine for tests: speaks just enough of vLLM's OpenAI API to be measured
with `--endpoint`, and misbehaves on request.

Well-behaved, it streams `max_tokens` chunks `tick_s` apart for `/v1/completions` and
`/v1/chat/completions`; takes token-id prompts when `accept_ids` (refusing ids outside
`[0, vocab_size)` with a 400, as vLLM does) and text (one token per word); keeps a prefix cache of
16-token blocks across requests, reported as `usage.prompt_tokens_details.cached_tokens` when
`report_cached`; serves `/v1/models` and a `/metrics` with vLLM's counter names.

`fault` makes every streaming generation request fail one way (non-streaming requests, used by the
client's probes, are always served properly):
  html              200 with an HTML page
  non_sse           200 with a plain JSON completion body
  truncated         three chunks, then half an event, then the end of the body (no [DONE])
  bad_json          one chunk, then a `data:` line that is not JSON
  fail_after        streaming requests after the first `fail_after` get a 500 with a plain-text body
  no_headers        the request is read and never answered
  close_mid_stream  three chunks, then the connection is cut
  rate_limited      every other streaming request gets a 429 with `Retry-After: retry_after` (a rate limit)
  no_first_token    headers, then nothing: the first token never comes
and these fail every request, the probes' too:
  chat_only         /v1/completions is a 404 `{"detail": "Not Found"}` (a chat-only server); chat works
  unknown_model     both APIs answer 404 model_not_found for the model /v1/models lists
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web

FAULTS = ("html", "non_sse", "truncated", "bad_json", "fail_after", "no_headers", "close_mid_stream", "rate_limited",
          "no_first_token", "chat_only", "unknown_model")
BLOCK = 16


@dataclass
class PeerConfig:
    model: str = "peer"
    other_models: tuple[str, ...] = ()  # more ids /v1/models lists (a server with several models)
    tick_s: float = 0.01
    accept_ids: bool = True
    vocab_size: int = 4096
    report_cached: bool = True
    max_model_len: int = 32768
    fault: str | None = None
    fail_after: int = 0
    retry_after: str | None = "1"  # the rate_limited fault's Retry-After header (None: none sent)
    prefill_s_per_token: float = 1e-5  # what /metrics reports as prefill time (no real compute)
    keepalive_s: float = 75.0  # idle keep-alive connections are closed after this (uvicorn: 5 s)
    # chat streams of other shapes: the first `reasoning_chunks` chunks carry reasoning in
    # `reasoning_field` (vLLM ≥ 0.10: reasoning; older vLLM, SGLang: reasoning_content), the rest the
    # answer as `answer_shape`: content (a string), parts (a list of text parts) or tool_calls fragments
    reasoning_chunks: int = 0
    reasoning_field: str = "reasoning_content"
    answer_shape: str = "content"
    # the wait before each reasoning chunk (None: tick_s), so the two phases' ITL differ by construction
    reasoning_tick_s: float | None = None


@dataclass
class _Counters:
    requests: int = 0
    streamed: int = 0  # streaming requests (the load's; probes are not streamed)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cache_queries: int = 0
    cache_hits: int = 0
    running: int = 0
    prompts: list[list[object]] = field(default_factory=list)


class OpenAIPeer:
    def __init__(self, cfg: PeerConfig | None = None) -> None:
        self.cfg = cfg or PeerConfig()
        if self.cfg.fault is not None and self.cfg.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.cfg.fault!r}; one of {FAULTS}")
        self.counters = _Counters()
        self._blocks: set[bytes] = set()
        self._runner: web.AppRunner | None = None
        self._hung: list[asyncio.Future[None]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                     keepalive_timeout=self.cfg.keepalive_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for fut in self._hung:
            if not fut.done():
                fut.set_result(None)
        if self._runner:
            await self._runner.cleanup()

    # ---- the API ---------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "max_model_len": self.cfg.max_model_len}
            for name in (self.cfg.model, *self.cfg.other_models)]})

    def _tokens(self, body: dict[str, object]) -> list[object] | web.Response:
        prompt = body.get("prompt")
        if prompt is None and isinstance(body.get("messages"), list):
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"])  # type: ignore[union-attr]
        if isinstance(prompt, list):
            if not self.cfg.accept_ids:
                return _error(400, "prompt must be a string")
            bad = next((t for t in prompt if not isinstance(t, int) or not 0 <= t < self.cfg.vocab_size), None)
            if bad is not None:
                return _error(400, f"Token id {bad} is out of vocabulary")
            return list(prompt)
        if isinstance(prompt, str):
            return list(prompt.split())
        return _error(400, "prompt is required")

    def _cached(self, tokens: list[object]) -> int:
        """Tokens of full blocks whose whole prefix an earlier request had (never the last token)."""
        digest = hashlib.blake2b(digest_size=16)
        hits, still = 0, True
        for end in range(BLOCK, len(tokens), BLOCK):
            digest.update(json.dumps(tokens[end - BLOCK:end]).encode())
            h = digest.copy().digest()
            if still and h in self._blocks:
                hits = end
            else:
                still = False
            self._blocks.add(h)
        return hits

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.cfg.fault == "chat_only" and not request.path.endswith("/chat/completions"):
            return web.json_response({"detail": "Not Found"}, status=404)
        if self.cfg.fault == "unknown_model":
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        tokens = self._tokens(body)
        if isinstance(tokens, web.Response):
            return tokens
        c, cfg = self.counters, self.cfg
        c.requests += 1
        c.prompts.append(tokens)
        cached = self._cached(tokens)
        c.cache_queries += len(tokens)
        c.cache_hits += cached
        c.prefill_s += (len(tokens) - cached) * cfg.prefill_s_per_token
        n_out = int(body.get("max_tokens") or 16)
        chat = request.path.endswith("/chat/completions")
        usage = {"prompt_tokens": len(tokens), "completion_tokens": n_out, "total_tokens": len(tokens) + n_out}
        if cfg.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        rid = f"cmpl-{c.requests}"
        if not body.get("stream"):
            return web.json_response({"id": rid, "object": "text_completion", "model": cfg.model,
                                      "choices": [{"index": 0, "text": " x" * n_out, "finish_reason": "length"}],
                                      "usage": usage})
        c.streamed += 1
        fault = cfg.fault if not (cfg.fault == "fail_after" and c.streamed <= cfg.fail_after) else None
        if fault == "html":
            return web.Response(text="<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html")
        if fault == "non_sse":
            return web.json_response({"id": rid, "object": "text_completion", "choices": [
                {"index": 0, "text": " x" * n_out, "finish_reason": "length"}], "usage": usage})
        if fault == "fail_after":
            return web.Response(status=500, text="Internal Server Error")
        if fault == "rate_limited" and c.streamed % 2:
            headers = {"Retry-After": cfg.retry_after} if cfg.retry_after is not None else None
            return web.json_response({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
                                     status=429, headers=headers)
        if fault == "no_first_token":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            hang = asyncio.get_running_loop().create_future()
            self._hung.append(hang)
            with contextlib.suppress(asyncio.CancelledError):
                await hang
            return resp
        if fault == "no_headers":
            hang = asyncio.get_running_loop().create_future()
            self._hung.append(hang)
            await hang
            return web.Response(status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        c.running += 1
        try:
            await self._stream(resp, request, rid, chat, n_out, usage, fault)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            c.running -= 1
        return resp

    async def _stream(self, resp: web.StreamResponse, request: web.Request, rid: str, chat: bool, n_out: int,
                      usage: dict[str, object], fault: str | None) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        for i in range(n_out):
            tick = self.cfg.tick_s
            if i < self.cfg.reasoning_chunks and self.cfg.reasoning_tick_s is not None:
                tick = self.cfg.reasoning_tick_s
            await asyncio.sleep(tick)
            self.counters.decode_s += tick
            choice = {"index": 0, "finish_reason": "length" if i == n_out - 1 else None}
            choice.update({"delta": self._delta(i)} if chat else {"text": " x"})
            await resp.write(_sse({"id": rid, "object": obj, "model": self.cfg.model, "choices": [choice]}))
            if fault == "bad_json":
                await resp.write(b'data: {"id": "' + rid.encode() + b'", "choices": [{"text": oops}\n\n')
                return
            if fault in ("truncated", "close_mid_stream") and i == 2:
                if fault == "truncated":
                    await resp.write(b'data: {"id": "' + rid.encode() + b'", "choi')
                    await resp.write_eof()
                elif request.transport is not None:
                    request.transport.abort()
                return
        await resp.write(_sse({"id": rid, "object": obj, "model": self.cfg.model, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    def _delta(self, i: int) -> dict[str, object]:
        cfg = self.cfg
        if i < cfg.reasoning_chunks:
            return {"role": "assistant", "content": None, cfg.reasoning_field: " think"} if i == 0 else \
                {cfg.reasoning_field: " think"}
        if cfg.answer_shape == "parts":
            return {"content": [{"type": "text", "text": " x"}]}
        if cfg.answer_shape == "tool_calls":
            call: dict[str, object] = {"index": 0, "function": {"arguments": '{"q": 1'}}
            if i == cfg.reasoning_chunks:
                call.update(id="call_0", type="function", function={"name": "lookup", "arguments": ""})
            return {"content": None, "tool_calls": [call]}
        return {"content": " x"}

    async def _metrics(self, request: web.Request) -> web.Response:
        c, label = self.counters, f'{{engine="0",model_name="{self.cfg.model}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{label} {c.running}",
            "# TYPE vllm:request_prefill_time_seconds histogram",
            f"vllm:request_prefill_time_seconds_sum{label} {c.prefill_s}",
            f"vllm:request_prefill_time_seconds_count{label} {c.requests}",
            "# TYPE vllm:request_decode_time_seconds histogram",
            f"vllm:request_decode_time_seconds_sum{label} {c.decode_s}",
            f"vllm:request_decode_time_seconds_count{label} {c.requests}",
            "# TYPE vllm:prefix_cache_queries counter", f"vllm:prefix_cache_queries_total{label} {c.cache_queries}",
            "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total{label} {c.cache_hits}",
            "# TYPE process_open_fds gauge", "process_open_fds 12",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": status}},
                             status=status)


@contextlib.contextmanager
def serve_in_thread(cfg: PeerConfig | None = None, peer_cls: type[OpenAIPeer] | None = None,
                    ) -> Iterator[tuple[OpenAIPeer, str]]:
    """Run a peer (an `OpenAIPeer`, or `peer_cls`) on its own event loop in a thread; yields (peer,
    base_url ending in /v1)."""
    loop = asyncio.new_event_loop()
    peer = (peer_cls or OpenAIPeer)(cfg)
    port: list[int] = []
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        port.append(loop.run_until_complete(peer.start()))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("test peer did not start")
    try:
        yield peer, f"http://127.0.0.1:{port[0]}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
