"""The aiohttp application: its middleware and OpenAI-compatible generation (the endpoints that read the
server, /health, /metrics, /v1/models, /v1/engine and /v1/steps, are `introspection`'s).

Handlers never touch the engine directly; they go through an `EngineClient` (an engine thread or an engine process owns it).
Streaming writes one SSE chunk per engine step per request, so chunk arrival times at the client
are step times, which is what ITL analysis needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from itlbench.errors import ConfigError
from itlbench.server.detok import IncrementalDetokenizer
from itlbench.server.guard import client_gone_quietly, guard_middleware
from itlbench.server.introspection import install_introspection
from itlbench.server.protocol import (
    ApiError,
    GenerationRequest,
    bad,
    bad_config,
    parse_chat,
    parse_completion,
    parse_json,
    prompt_ids,
)
from itlbench.server.responses import SSE_DONE, ResponseBuilder, sse, usage
from itlbench.server.state import STATE, ServerState, server_state
from itlbench.server.stop_strings import StopStrings, cut_at_stop
from itlbench.serving.client import EngineClient, EngineDeadError, QueueFullError, RequestStream

log = logging.getLogger("itlbench.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_UNTRACED = contextlib.nullcontext()
# Bodies above this are parsed and tokenised on a worker thread: a 4 MiB prompt takes the byte
# tokenizer ~0.2 s, which on the event loop would stall every stream; below it a thread costs more
# than it saves. Outputs longer than DECODE_OFF_LOOP_IDS are decoded there too.
OFF_LOOP_BYTES = 64 << 10
DECODE_OFF_LOOP_IDS = 16384
_pool: ThreadPoolExecutor | None = None


def build_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[guard_middleware, _errors, _auth], client_max_size=state.max_body_bytes)
    app[STATE] = state
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    install_introspection(app)
    return app


# OpenAI's header naming the request: the SDKs read it into `request_id` (responses and errors alike), and
# here it is the engine's request id, which /v1/steps, the metrics' traces and the server log name.
REQUEST_ID_HEADER = "x-request-id"


def error_response(err: ApiError) -> web.Response:
    headers = {REQUEST_ID_HEADER: err.request_id} if err.request_id else None
    return web.json_response(err.body(), status=err.status, headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        resp = error_response(err)
        if err.status == 408:  # the rest of the body may never come: do not wait for it
            resp.force_close()
        return resp
    except web.HTTPRequestEntityTooLarge:
        limit = server_state(request).max_body_bytes
        return error_response(ApiError(413, f"body: larger than this server's limit of {limit / 2**20:g} MiB "
                                            "(itlbench serve --max-body-mib raises it)", "body"))
    except web.HTTPException as exc:
        if exc.status >= 400:
            resp = error_response(ApiError(exc.status, exc.reason, None, "not_found_error"
                                           if exc.status == 404 else "invalid_request_error"))
            if "Allow" in exc.headers:  # a 405 says which methods the path takes (RFC 9110)
                resp.headers["Allow"] = exc.headers["Allow"]
            return resp
        raise
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception as exc:  # noqa: BLE001 - a handler bug must answer 500, not drop the connection
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, f"internal error: {exc!r}", None, "internal_server_error"))


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = server_state(request).api_key
    if key and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")  # any bytes: 401
        if not hmac.compare_digest(given, f"Bearer {key}".encode()):  # constant time: no timing oracle
            raise ApiError(401, "Authorization: missing or invalid API key", "Authorization",
                           "authentication_error", "invalid_api_key")
    return await handler(request)


# ---- generation ---------------------------------------------------------------------------
# Content types a web page may POST cross-origin without a CORS preflight: a page the user visits
# could otherwise make their browser send load to a server on their loopback.
_SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


def _check_content_type(request: web.Request) -> None:
    if request.content_type in _SIMPLE_TYPES:
        raise ApiError(415, f"Content-Type: {request.content_type} is not accepted; send application/json",
                       "Content-Type")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion, "cmpl")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat, "chatcmpl")


Parser = Callable[[dict[str, Any]], GenerationRequest]


async def _generate(request: web.Request, parse: Parser, kind: str) -> web.StreamResponse:
    """Serve one generation under a fresh request id, which every answer, an error too, carries in its
    x-request-id header."""
    request_id = f"{kind}-{uuid.uuid4().hex}"
    try:
        return await _serve(request, parse, request_id)
    except ApiError as err:
        err.request_id = request_id
        raise


async def _serve(request: web.Request, parse: Parser, request_id: str) -> web.StreamResponse:
    _check_content_type(request)
    raw = await _read_body(request)
    arrival_ns = time.perf_counter_ns()
    state = server_state(request)
    req, prompt_ids = await _off_loop(len(raw) > OFF_LOOP_BYTES, _prepare, state, raw, parse)
    max_tokens = _max_tokens(state.engine.engine.max_model_len, req, len(prompt_ids))
    sampling = req.sampling(max_tokens)
    traced = (_UNTRACED if state.tracing is None
              else state.tracing.begin(request, req, request_id, arrival_ns, len(prompt_ids), max_tokens))
    stops = _stop_strings(req, state.engine.engine)
    out = ResponseBuilder(request_id, state.model_name, req.chat)
    if not req.stream:
        with traced, _stop_verdict(state, traced, request_id, stops):
            async with _admitted(state.engine, prompt_ids, sampling, request_id, arrival_ns) as stream:
                return await _collect(stream, out, req, len(prompt_ids), state.engine.engine, stops)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       REQUEST_ID_HEADER: request_id})
    with client_gone_quietly():  # outside the span, which marks a client that left as client_disconnected
        with traced, _stop_verdict(state, traced, request_id, stops):
            async with _admitted(state.engine, prompt_ids, sampling, request_id, arrival_ns) as stream:
                await resp.prepare(request)
                await _stream(resp, state.engine.engine, stream, out, req, len(prompt_ids), stops)
    return resp


async def _read_body(request: web.Request) -> bytes:
    limit = server_state(request).body_timeout_s
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, f"body: not received within {limit:g} s (itlbench serve --body-timeout raises it)",
                       "body") from None


async def _off_loop(big: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, on the tokenising threads when `big`: those are few, so a flood of huge prompts
    queues there instead of taking the threads other handlers use."""
    global _pool
    if not big:
        return fn(*args)
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="itlbench-tokenize")
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)


def _prepare(state: ServerState, raw: bytes, parse: Parser) -> tuple[GenerationRequest, list[int]]:
    """The request and its prompt's token ids, validated; safe to run off the loop (no I/O)."""
    req = parse(parse_json(raw))
    if req.model is not None and req.model != state.model_name:
        raise ApiError(404, f"model: {req.model!r} does not exist; this server serves {state.model_name!r}",
                       "model", "invalid_request_error", "model_not_found")
    return req, prompt_ids(state.engine.engine.tokenizer, req)


def _max_tokens(max_model_len: int, req: GenerationRequest, num_prompt: int) -> int:
    """The request's output cap: what it asked for, refused if the context cannot hold it; a default (the rest
    of the context, or a completion's 16) is cut to what fits, as vLLM's, since the client asked for none."""
    room = max_model_len - num_prompt
    if room <= 0:
        raise _too_long(req.prompt_param, f"the maximum context length is {max_model_len} tokens, and the "
                        f"{num_prompt} prompt tokens leave no room to generate")
    if req.max_tokens is None:
        return room
    if req.max_tokens_defaulted:
        return min(req.max_tokens, room)
    if req.max_tokens > room:
        raise _too_long(req.max_tokens_param, f"the maximum context length is {max_model_len} tokens: {num_prompt} "
                        f"prompt tokens + {req.max_tokens} {req.max_tokens_param} exceed it; use at most {room}")
    return req.max_tokens


def _too_long(param: str, message: str) -> ApiError:
    """OpenAI's context overflow: code context_length_exceeded and the words "maximum context length", by which
    SDK wrappers (LiteLLM, LangChain) tell it from other 400s to truncate or fall back."""
    err = bad(param, message)
    err.code = "context_length_exceeded"
    return err


@contextlib.asynccontextmanager
async def _admitted(engine: EngineClient, prompt_ids: list[int], sampling: Any, request_id: str,
                    arrival_ns: int) -> AsyncIterator[RequestStream]:
    """The request, admitted; aborted on the way out, a no-op when it finished, which frees its KV blocks
    when the client went away."""
    stream = await _admit(engine, prompt_ids, sampling, request_id, arrival_ns)
    try:
        yield stream
    finally:
        stream.abort()


async def _admit(engine: EngineClient, prompt_ids: list[int], sampling: Any, request_id: str,
                 arrival_ns: int) -> RequestStream:
    try:
        return await engine.add(prompt_ids, sampling, request_id, arrival_ns)
    except ConfigError as exc:
        raise bad_config(exc) from exc
    except QueueFullError as exc:
        raise ApiError(429, f"server over capacity: {exc}", None, "rate_limit_error", "queue_full") from exc
    except EngineDeadError as exc:
        raise ApiError(503, str(exc), None, "service_unavailable", "engine_dead") from exc


async def _stream(resp: web.StreamResponse, engine: Any, stream: RequestStream, out: ResponseBuilder,
                  req: GenerationRequest, num_prompt: int, stops: StopStrings | None) -> None:
    """The stream's SSE events: the role (chat), one chunk per engine step, the usage, [DONE]."""
    continuous = req.continuous_usage
    if req.chat:
        await resp.write(sse(out.role_chunk(usage(num_prompt, 0) if continuous else None)))
    detok = IncrementalDetokenizer(engine.tokenizer)
    generated, cached = 0, None
    try:
        async for o in stream:
            cached = o.num_cached_tokens
            if not o.new_token_ids and not o.finished:
                continue
            ids = list(o.new_token_ids)
            reason = o.finish_reason if o.finished else None
            shown, stop_reason = _stop_token(req, ids, reason, engine)
            if stops is None:
                text = detok.push(shown, final=o.finished)
            else:
                text, ids, reason, stop_reason = cut_at_stop(stops, stream, generated, shown, ids, reason, stop_reason)
            generated += len(ids)
            await resp.write(sse(out.chunk(text, ids, reason, stop_reason,
                                           usage(num_prompt, generated, cached) if continuous else None)))
            if reason is not None:
                break  # finished; after a stop string, what the engine made meanwhile is dropped
    except EngineDeadError as exc:
        await resp.write(sse(ApiError(500, str(exc), None, "internal_server_error", "engine_error").body()))
    else:
        if req.include_usage:
            await resp.write(sse(out.usage_chunk(num_prompt, generated, cached)))
    await resp.write(SSE_DONE)
    await resp.write_eof()


async def _collect(stream: RequestStream, out: ResponseBuilder, req: GenerationRequest, num_prompt: int,
                   engine: Any, stops: StopStrings | None) -> web.Response:
    ids: list[int] = []
    reason: str | None = None
    stop_reason: int | str | None = None
    texts: list[str] = []  # with stop strings: decoded as streamed, so the text is the streamed text
    cached = None
    try:
        async for o in stream:
            cached = o.num_cached_tokens
            reason = o.finish_reason if o.finished else None
            if stops is None:
                ids.extend(o.new_token_ids)
                continue
            new = list(o.new_token_ids)
            shown, stop_reason = _stop_token(req, new, reason, engine)
            text, new, reason, stop_reason = cut_at_stop(stops, stream, len(ids), shown, new, reason, stop_reason)
            ids.extend(new)
            texts.append(text)
            if reason is not None:
                break
    except EngineDeadError as exc:
        raise ApiError(500, str(exc), None, "internal_server_error", "engine_error") from exc
    if stops is None:
        shown, stop_reason = _stop_token(req, ids, reason, engine)
        text = await _off_loop(len(shown) > DECODE_OFF_LOOP_IDS, engine.tokenizer.decode, shown)
    else:
        text = "".join(texts)
    return web.json_response(out.full(text, ids, reason, num_prompt, cached, stop_reason),
                             headers={REQUEST_ID_HEADER: out.request_id})


def _stop_strings(req: GenerationRequest, engine: Any) -> StopStrings | None:
    if not req.stop:
        return None
    return StopStrings(engine.tokenizer, req.stop, req.include_stop_str_in_output, req.min_tokens)


@contextlib.contextmanager
def _stop_verdict(state: ServerState, traced: Any, request_id: str, stops: StopStrings | None) -> Iterator[None]:
    """With stop strings, the front end says how the request ended: metrics hold its finish until then, and
    record (as the trace does) "stop" and the tokens kept when a stop string ended it, whatever the engine,
    which may have run on to max_tokens meanwhile, reported."""
    if stops is None:
        yield
        return
    state.metrics.await_verdict(request_id)
    try:
        yield
    finally:
        if stops.matched is None:
            state.metrics.verdict(request_id, None)
        else:
            state.metrics.verdict(request_id, "stop", stops.num_tokens)
            if traced is not _UNTRACED:
                traced.verdict = ("stop", stops.num_tokens)


def _stop_token(req: GenerationRequest, ids: list[int], reason: str | None, engine: Any) -> tuple[list[int], int | None]:
    """The ids whose text is shown, and vLLM's `stop_reason`. A response a stop token or EOS ended (finish
    reason "stop", the token last) keeps the token in `token_ids` and usage, but not its text, unless
    include_stop_str_in_output; `stop_reason` is that token when it is one of stop_token_ids, null for EOS.
    (A stop string's `stop_reason` is the string: `stop_strings.cut_at_stop`.)"""
    if reason != "stop" or not ids:
        return ids, None
    last = ids[-1]
    eos = not req.ignore_eos and last in engine.model_config.eos_token_ids
    stop_reason = None if eos or last not in req.stop_token_ids else last
    return (ids if req.include_stop_str_in_output else ids[:-1]), stop_reason
