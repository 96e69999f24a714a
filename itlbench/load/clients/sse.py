"""Streaming OpenAI client: one pooled aiohttp session, every chunk timestamped on arrival.

Each network read is stamped with `time.perf_counter_ns()` before any parsing, and that time is
given to every SSE event in the read. Events are split by hand (no SSE library) and each JSON body is
decoded once. Tokens per event: `len(token_ids)` when the server sends ids, else 1 when text or
`delta.content` (or reasoning, a tool call: `deltas.py`) is non-empty, else 0 (role-only, finish-only and usage chunks carry none).
A response that is not a well-formed event stream (HTML, a plain JSON body, a `data:` line that is not
JSON, a stream cut before `[DONE]`, headers that never come) becomes a failed request row whose
`error_kind` says which, never an exception out of `run`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from itlbench.load.clients.chunk_rows import chunk_columns, hand_over, settled_end
from itlbench.load.clients.deltas import choice_kind, logprob_tokens
from itlbench.load.clients.sse_events import SseEvents, StreamError
from itlbench.load.sink import RowWriter
from itlbench.load.target import Target
from itlbench.rundir.coerce import as_count, as_float, as_str
from itlbench.workloads.plan import RequestPlan

try:
    from orjson import loads as _loads
except ImportError:  # optional speed-up
    _loads = json.loads

_now = time.perf_counter_ns
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)
# A pooled connection idle longer than this is not reused. Servers close idle keep-alive connections
# (uvicorn, under vLLM and SGLang, after 5 s); reusing one the server is closing fails the request
# ("Can not write request body"), which a client loop paused for a moment makes likely. Staying well
# under 5 s keeps the client the side that closes.
IDLE_CONNECTION_S = 2.0
HEAD_BYTES = 160  # of a body kept to explain a response that was not an event stream
HEAD_LIMIT_WORDS = ("Got more than", "Too many headers", "too long", "Header value too long")
ID_CHARS = 256  # of a server's `id` and `finish_reason` kept (they are labels, not content)


@dataclass(slots=True)
class _Exchange:
    """Mutable state of one request while it streams."""

    plan: RequestPlan
    scheduled_ns: int
    stream: int | None
    sent_ns: int | None = None
    times: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    tokens: int = 0
    first_answer_ns: int | None = None  # first chunk that is not reasoning (content or a tool call)
    reasoning_chunks: int = 0
    server_prompt_ms: float | None = None  # server-side timings where the server reports them (llama.cpp)
    server_decode_ms: float | None = None
    server_decode_tokens: int | None = None
    server_id: str | None = None
    finish_reason: str | None = None
    prompt_reported: int | None = None
    cached_reported: int | None = None
    completion_reported: int | None = None
    http_status: int | None = None
    retry_after: str | None = None  # a 429/503's Retry-After header, as sent
    status: str = "error"
    error: str | None = None
    error_kind: str | None = None
    content_type: str | None = None
    head: bytes = b""  # the body's first bytes, to explain a response that was not an event stream
    events: int = 0  # data events read
    leftover: int = 0  # bytes of an unfinished event when the body ended
    saw_done: bool = False
    connection_error: bool = False
    chunks_written: int = 0  # chunk rows already handed to the sink (long streams write as they go)
    read_times: list[int] | None = None  # user-space read time per chunk, where `times` holds kernel stamps
    watch: Any = None  # a StreamObserver's per-request state


class StreamObserver(Protocol):
    """Live telemetry of every request (itlbench.telemetry). The client holds None when telemetry is
    off, so it then does no extra work per chunk; observers read the exchange, never change it."""

    def on_start(self, ex: _Exchange) -> dict[str, str] | None:
        """Just before the request is sent; returns extra HTTP headers (e.g. `traceparent`)."""

    def on_chunk(self, ex: _Exchange, t_ns: int, n_tokens: int) -> None:
        """A content chunk was stamped and appended to `ex.times`."""

    def on_end(self, ex: _Exchange, done_ns: int) -> None:
        """The request is over, whatever its status (its row has been written)."""


# A stream hands its chunk rows over every this many chunks, so a long request's chunks reach disk
# while it still runs instead of all at its end.
CHUNK_ROWS_PER_HANDOFF = 256


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the driver needs back from one request."""

    status: str
    connection_error: bool
    http_status: int | None
    output_tokens: int
    sent_ns: int | None
    first_token_ns: int | None
    error_kind: str | None = None
    error: str | None = None  # the failure in words, for an abort's reason (the record keeps it too)
    retry_after: str | None = None  # a 429/503's Retry-After header: the stream waits that long (load.backoff)


def build_body(plan: RequestPlan, target: Target) -> dict[str, Any]:
    """The JSON body for one plan; token-id prompts only where the target takes them."""
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": plan.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": target.temperature,
    }
    if target.forced_lengths:
        body["ignore_eos"] = True
        body["min_tokens"] = plan.max_tokens
    use_ids = plan.prompt_token_ids is not None and target.accepts_token_ids and target.api == "completions"
    if use_ids:
        body["prompt"] = list(plan.prompt_token_ids or ())
    elif plan.prompt_text is None:
        raise ValueError(f"request {plan.request_id}: target takes text prompts but the plan has no prompt_text")
    elif target.api == "chat":
        body["messages"] = [{"role": "user", "content": plan.prompt_text}]
    else:
        body["prompt"] = plan.prompt_text
    body.update(target.extra_body)
    return body


class StreamClient:
    """Sends plans over one shared session and writes one request row plus its chunk rows each.

    `recent_itl_ns` / `recent_ttft_ns` keep the last gaps for a cheap live progress line.
    """

    def __init__(self, target: Target, sink: RowWriter, *, limit: int = 0, recent: int = 4096,
                 observer: StreamObserver | None = None, idle_connection_s: float = IDLE_CONNECTION_S) -> None:
        self.target = target
        self.observer = observer
        self.idle_connection_s = idle_connection_s
        self.sink = sink
        self.limit = limit
        self.recent_itl_ns: deque[int] = deque(maxlen=recent)
        self.recent_ttft_ns: deque[int] = deque(maxlen=max(64, recent // 16))
        self.streams_with_tokens: set[int] = set()  # closed-loop streams that have received a token
        self._session: aiohttp.ClientSession | None = None
        self._headers = target.headers()

    def stamp_source_name(self) -> str:
        return "aiohttp"

    def clock_report(self) -> dict[str, int | None] | None:
        return None

    async def __aenter__(self) -> StreamClient:
        connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, ttl_dns_cache=300,
                                         keepalive_timeout=self.idle_connection_s)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        # a response head is bounded: lines of 8 KiB at most (aiohttp's own limit), and a header count
        # that keeps the whole head near `max_head_bytes`
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                              max_headers=max(16, self.target.max_head_bytes // 512))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(self, plan: RequestPlan, scheduled_ns: int, stream: int | None = None) -> Outcome:
        """Send one plan and record it whatever happens; cancellation is recorded, then re-raised."""
        ex = _Exchange(plan, scheduled_ns, stream)
        try:
            async with asyncio.timeout(self.target.timeout_s):
                await self._exchange(ex)
        except asyncio.CancelledError:
            ex.status, ex.error, ex.error_kind = "cancelled", "cancelled (drain timeout or stop)", "cancelled"
            if ex.sent_ns is not None and ex.http_status is None:
                ex.error, ex.error_kind = "cancelled (drain timeout or stop) before any response headers", "no_headers"
            raise
        except TimeoutError as e:  # before OSError: TimeoutError is one
            if isinstance(e, aiohttp.ClientError):  # connect timeout: the server is unreachable
                ex.status, ex.error, ex.connection_error = "error", f"{type(e).__name__}: {e}", True
                ex.error_kind = "connection"
            elif ex.http_status is None:
                ex.status, ex.error_kind = "timeout", "no_headers"
                ex.error = f"no response headers within {self.target.timeout_s} s"
            else:
                ex.status, ex.error_kind = "timeout", "timeout"
                ex.error = f"no end of stream within {self.target.timeout_s} s"
        except StreamError as e:
            ex.status, ex.error, ex.error_kind = "error", str(e), e.kind
        except aiohttp.ClientResponseError as e:  # aiohttp could not parse the response head
            ex.status, ex.error = "error", f"bad response head: {str(e.message)[:200]}"
            ex.error_kind = "head_too_large" if any(w in str(e.message) for w in HEAD_LIMIT_WORDS) else "other"
        except CONNECTION_ERRORS as e:
            ex.status, ex.error, ex.connection_error = "error", f"{type(e).__name__}: {e}", True
            if ex.http_status is None:  # no answer at all
                ex.error_kind = "connection"
            else:  # the server answered, then the connection broke mid-stream
                ex.error_kind = "closed"
                ex.error = f"connection closed mid-stream after {ex.events} events ({type(e).__name__}: {e})"
        except Exception as e:  # noqa: BLE001 - a bad response must not kill the run
            ex.status, ex.error, ex.error_kind = "error", f"{type(e).__name__}: {e}", "other"
        finally:
            self._record(ex, _now())
        return Outcome(ex.status, ex.connection_error, ex.http_status, ex.tokens, ex.sent_ns,
                       ex.times[0] if ex.times else None, ex.error_kind if ex.status != "ok" else None,
                       ex.error if ex.status != "ok" else None, ex.retry_after)

    def _request(self, ex: _Exchange) -> tuple[bytes, dict[str, str]]:
        """The request's JSON body and its headers: the target's, plus what the observer adds on start."""
        body = json.dumps(build_body(ex.plan, self.target)).encode()
        headers = self._headers
        if self.observer is not None:
            extra = self.observer.on_start(ex)
            if extra:
                headers = {**headers, **extra}
        return body, headers

    async def _exchange(self, ex: _Exchange) -> None:
        assert self._session is not None, "use StreamClient as an async context manager"
        data, headers = self._request(ex)
        ex.sent_ns = _now()
        async with self._session.post(self.target.url, data=data, headers=headers) as resp:
            ex.http_status = resp.status
            if resp.status != 200:
                ex.retry_after = resp.headers.get("Retry-After")
                ex.error, ex.error_kind = await _error_message(resp), "http_status"
                return
            ex.content_type = resp.headers.get("Content-Type")
            await self._read_stream(resp, ex)
        _settle(ex)

    async def _read_stream(self, resp: aiohttp.ClientResponse, ex: _Exchange) -> None:
        events = SseEvents(self.target.max_event_bytes)
        content = resp.content
        while True:
            data = await content.readany()
            t = _now()
            if not data:
                ex.leftover = events.pending
                return
            if len(ex.head) < HEAD_BYTES:
                ex.head += data[:HEAD_BYTES - len(ex.head)]
            # events the read ended before a bad one are still the server's: recorded, then the error
            events.feed_each(data, lambda payload: self._on_event(payload, t, ex))  # noqa: B023 (called at once)

    def _on_event(self, payload: bytes, t: int, ex: _Exchange) -> None:
        ex.events += 1
        if payload == b"[DONE]":
            ex.saw_done = True
            return
        try:
            obj = _loads(payload)
        except ValueError:
            raise StreamError("bad_json", f"invalid JSON in SSE data line {ex.events}: {_clip(payload)}") from None
        if not isinstance(obj, dict):
            raise StreamError("bad_json", f"SSE data line {ex.events} is not a JSON object: {_clip(payload)}")
        choices = obj.get("choices")
        if choices:
            if not isinstance(choices, list) or not isinstance(choices[0], dict):
                raise StreamError("bad_json", f"SSE data line {ex.events}: `choices` is not a list of objects: "
                                              f"{_clip(payload)}")
            self._on_choice(choices[0], t, ex)
        if ex.server_id is None:  # untrusted: a string (a number written out), else null
            ex.server_id = as_str(obj.get("id"), ID_CHARS)
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage:  # counts: non-negative int64, else null
            ex.prompt_reported = as_count(usage.get("prompt_tokens"))
            ex.completion_reported = as_count(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                ex.cached_reported = as_count(details.get("cached_tokens"))
        timings = obj.get("timings")  # llama.cpp's own clock for this request, on its final chunk
        if isinstance(timings, dict) and timings:
            ex.server_prompt_ms = _ms(timings.get("prompt_ms"))
            ex.server_decode_ms = _ms(timings.get("predicted_ms"))
            ex.server_decode_tokens = as_count(timings.get("predicted_n"))
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            ex.error = as_str(err.get("message", err) if isinstance(err, dict) else err) or _clip(payload)

    def _on_choice(self, c: dict[str, Any], t: int, ex: _Exchange) -> None:
        ids = c.get("token_ids")
        kind = choice_kind(c)
        n = len(ids) if ids and isinstance(ids, list) else (logprob_tokens(c) or 1) if kind else 0
        if n:
            if kind == "reasoning":
                ex.reasoning_chunks += 1
            elif ex.first_answer_ns is None:
                ex.first_answer_ns = t
            self._add_chunk(ex, t, n)
        fr = c.get("finish_reason")
        if fr:
            ex.finish_reason = as_str(fr, ID_CHARS) or "unknown"

    def _add_chunk(self, ex: _Exchange, t: int, n: int) -> None:
        """One content chunk of `n` tokens stamped `t`."""
        times = ex.times
        if times:
            self.recent_itl_ns.append(t - times[-1])
        else:
            self.recent_ttft_ns.append(t - ex.scheduled_ns)
            if ex.stream is not None:
                self.streams_with_tokens.add(ex.stream)
        times.append(t)
        ex.counts.append(n)
        ex.tokens += n
        if len(times) - ex.chunks_written >= CHUNK_ROWS_PER_HANDOFF:
            self._write_chunks(ex, final=False)
        if self.observer is not None:
            self.observer.on_chunk(ex, t, n)

    def _record(self, ex: _Exchange, done_ns: int) -> None:
        p = ex.plan
        rid = p.request_id
        self.sink.add("requests", {
            "request_id": rid, "server_request_id": ex.server_id, "workload": p.workload, "cls": p.cls,
            "injected": p.injected, "stream": ex.stream, "session": p.session, "turn": p.turn,
            "prompt_tokens": p.prompt_tokens, "prompt_tokens_reported": ex.prompt_reported,
            "cached_tokens_reported": ex.cached_reported,
            "max_tokens": p.max_tokens, "scheduled_ns": ex.scheduled_ns, "sent_ns": ex.sent_ns,
            "first_token_ns": ex.times[0] if ex.times else None,
            "last_token_ns": ex.times[-1] if ex.times else None, "done_ns": done_ns,
            "first_answer_ns": ex.first_answer_ns, "reasoning_chunks": ex.reasoning_chunks,
            "server_prompt_ms": ex.server_prompt_ms, "server_decode_ms": ex.server_decode_ms,
            "server_decode_tokens": ex.server_decode_tokens,
            "output_tokens": ex.tokens, "output_tokens_reported": ex.completion_reported,
            "num_chunks": len(ex.times), "status": ex.status, "http_status": ex.http_status,
            "error": ex.error, "error_kind": ex.error_kind if ex.status != "ok" else None,
            "finish_reason": ex.finish_reason,
        })
        self._write_chunks(ex)
        if self.observer is not None:
            self.observer.on_end(ex, done_ns)

    def _write_chunks(self, ex: _Exchange, final: bool = True) -> None:
        """Hand over the chunk rows not yet written (index continues across hand-offs)."""
        start = ex.chunks_written
        end = settled_end(ex.times, start, final)
        if end > start:
            hand_over(self.sink, chunk_columns(ex.plan.request_id, ex.times, ex.counts, ex.read_times, start, end))
            ex.chunks_written = end


def _clip(data: bytes) -> str:
    text = data[:HEAD_BYTES].decode(errors="replace")
    return repr(text + ("…" if len(data) > HEAD_BYTES else ""))


def _ms(value: Any) -> float | None:
    """A server's duration in ms: finite and non-negative, else null (untrusted)."""
    v = as_float(value)
    return v if v is not None and 0 <= v < 1e12 else None


def _settle(ex: _Exchange) -> None:
    """A 200 response's status once its body ended: ok on [DONE] or a finish_reason, else why not."""
    if ex.error is None and (ex.saw_done or ex.finish_reason is not None):
        ex.status = "ok"
    elif ex.error is None:
        ex.error_kind, ex.error = _unfinished(ex)
    elif ex.error_kind is None:
        ex.error_kind = "server_error"


def _unfinished(ex: _Exchange) -> tuple[str, str]:
    """(error_kind, error) for a 200 response whose body ended without [DONE] or a finish_reason."""
    if ex.events == 0:
        return "not_sse", (f"not an event stream: HTTP 200 with Content-Type {ex.content_type or 'none'} "
                           f"and no SSE data line; body starts {_clip(ex.head)}")
    cut = f", {ex.leftover} bytes of an unfinished event" if ex.leftover else ""
    return "truncated", f"stream ended before [DONE] after {ex.events} data events{cut}"


async def _error_message(resp: aiohttp.ClientResponse) -> str:
    return error_text(resp.status, await resp.content.read(4096), resp.headers.get("Content-Type"))


def error_text(status: int, raw: bytes, content_type: str | None = None) -> str:
    """`HTTP <status>: <message>`: an OpenAI error's message, else the body as the server sent it (JSON stays
    JSON, never a Python repr); an HTML error page (a proxy's 502) is cut to its title or first line of text."""
    body = raw.decode(errors="replace").strip()
    try:
        obj = json.loads(body)
    except ValueError:
        return f"HTTP {status}: {html_gist(body) if _is_html(body, content_type) else body[:500]}"
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    msg = err.get("message") if isinstance(err, dict) else err
    return f"HTTP {status}: {msg if isinstance(msg, str) and msg else body[:500]}"


def _is_html(body: str, content_type: str | None) -> bool:
    return "html" in (content_type or "").lower() or body[:200].lower().lstrip().startswith(("<!doctype", "<html"))


def html_gist(body: str) -> str:
    """An HTML page's <title>, else its first line of text: one line, not a page of markup."""
    title = re.search(r"<title[^>]*>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
    text = title.group(1) if title else re.sub(r"<[^>]+>", "\n", body)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return (" ".join(line.split())[:200] or "an HTML page") + " (HTML page)"
