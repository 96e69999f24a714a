"""The streaming client inside a Locust worker: StreamClient's parsing and records over gevent.

Only the transport differs from `sse_client.StreamClient`: requests go through Locust's
`FastHttpSession` (geventhttpclient), and the body is read one network read at a time from the
underlying response (private attributes: geventhttpclient is pinned). Locust's own
`iter_content`/`iter_lines` would not do: they block until 1,024 bytes arrive, which bunches chunks
and delays first tokens. What each read brings is stamped with that read's `perf_counter_ns`, as the
aiohttp client stamps a `readany`. Event splitting (`SseEvents`), token counting and the request and
chunk rows are StreamClient's own, so both drivers parse and count tokens identically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent import GreenletExit
from geventhttpclient.response import HTTPConnectionClosed
from geventhttpclient.useragent import ConnectionError as GhcConnectionError

from itlbench.load.clients.sse import (
    HEAD_BYTES,
    Outcome,
    StreamClient,
    _Exchange,
    _settle,
    build_body,
    error_text,
)
from itlbench.load.clients.sse_events import SseEvents, StreamError
from itlbench.load.sink import RowWriter
from itlbench.load.target import Target

_now = time.perf_counter_ns
CONNECTION_ERRORS = (GhcConnectionError, HTTPConnectionClosed, OSError)


class _FirstTokens(set[int]):
    """`streams_with_tokens` that reports each stream's first token as it happens (adaptive warmup)."""

    def __init__(self, on_new: Callable[[int], None]) -> None:
        super().__init__()
        self.on_new = on_new

    def add(self, stream: int) -> None:
        if stream not in self:
            super().add(stream)
            self.on_new(stream)


class GeventStreamClient(StreamClient):
    """Sends plans through a Locust FastHttpSession (one per user, or the worker's open-loop session)."""

    def __init__(self, target: Target, sink: RowWriter, on_first_token: Callable[[int], None]) -> None:
        super().__init__(target, sink)
        self.streams_with_tokens = _FirstTokens(on_first_token)
        # Locust asks for compressed bodies by default; a compressed SSE stream cannot be read by line.
        self._headers = {**self._headers, "Accept-Encoding": "identity"}

    async def __aenter__(self) -> GeventStreamClient:  # pragma: no cover - guard
        raise TypeError("GeventStreamClient runs under gevent; call run_g(plan, ..., session)")

    def run_g(self, plan: Any, scheduled_ns: int, stream: int | None, session: Any) -> Outcome:
        """Send one plan and record it whatever happens; a kill is recorded as cancelled, then re-raised."""
        ex = _Exchange(plan, scheduled_ns, stream)
        timer = gevent.Timeout(self.target.timeout_s) if self.target.timeout_s else None
        if timer is not None:
            timer.start()
        try:
            self._exchange_g(ex, session)
        except GreenletExit:
            ex.status, ex.error, ex.error_kind = "cancelled", "cancelled (drain timeout or stop)", "cancelled"
            raise
        except gevent.Timeout as t:
            if t is not timer:
                raise
            ex.status, ex.error = "timeout", f"no end of stream within {self.target.timeout_s} s"
            ex.error_kind = "timeout" if ex.http_status is not None else "no_headers"
        except StreamError as e:  # the same kinds as the aiohttp reader's (event_too_large, bad_json)
            ex.status, ex.error, ex.error_kind = "error", str(e), e.kind
        except CONNECTION_ERRORS as e:
            ex.status, ex.error, ex.connection_error = "error", f"{type(e).__name__}: {e}", True
            ex.error_kind = "connection" if ex.http_status is None else "closed"
        except Exception as e:  # noqa: BLE001 - a bad response must not kill the run
            ex.status, ex.error, ex.error_kind = "error", f"{type(e).__name__}: {e}", "other"
        finally:
            if timer is not None:
                timer.close()
            self._record(ex, _now())
        return Outcome(ex.status, ex.connection_error, ex.http_status, ex.tokens, ex.sent_ns,
                       ex.times[0] if ex.times else None, ex.error_kind if ex.status != "ok" else None,
                       ex.error if ex.status != "ok" else None)

    def _exchange_g(self, ex: _Exchange, session: Any) -> None:
        data = json.dumps(build_body(ex.plan, self.target)).encode()
        ex.sent_ns = _now()
        resp = session.request("POST", self.target.url, data=data, headers=self._headers, stream=True,
                               name=ex.plan.cls)
        raw = getattr(resp, "_response", None)
        if raw is None:  # no response at all: the error geventhttpclient raised (refused, reset, ...)
            raise resp.error
        ex.http_status = resp.status_code
        ex.content_type = resp.headers.get("Content-Type")
        if ex.http_status != 200:
            ex.error, ex.error_kind = error_text(ex.http_status, _error_body(resp, raw), ex.content_type), "http_status"
            ex.retry_after = resp.headers.get("Retry-After")
            return
        try:
            self._read_lines(raw, ex)
        finally:
            if not raw.message_complete:  # cancelled or broken mid-stream: never reuse this connection
                _discard(raw)
        _settle(ex)

    def _read_lines(self, raw: Any, ex: _Exchange) -> None:
        """Take what each network read brings, stamp it with the time that read returned (the aiohttp
        client's `readany` semantics), and parse it. Not `readline`: on an event that never ends it
        rescans a buffer growing without bound (a worker busy with it missed its heartbeats and was
        dropped); here every read goes through the splitter, whose `--limits event=` cap fails it."""
        events = SseEvents(self.target.max_event_bytes)
        t = _now()
        while True:
            buf = raw._body_buffer
            if not buf:
                if raw.message_complete:
                    ex.leftover = events.pending
                    return
                t = _recv(raw)
                continue
            data = bytes(buf)
            del buf[:]
            if len(ex.head) < HEAD_BYTES:
                ex.head += data[:HEAD_BYTES - len(ex.head)]
            # events the read ended before a bad one are still the server's: recorded, then the error
            events.feed_each(data, lambda payload: self._on_event(payload, t, ex))  # noqa: B023 (called at once)


def _recv(raw: Any) -> int:
    """One network read into the response's parser; when it returned."""
    sock = raw._sock
    if sock is None:
        raise HTTPConnectionClosed("connection closed.")
    try:
        data = sock.recv(raw.block_size)
        t = _now()
        raw.feed(data)
    except BaseException:
        raw.release()
        raise
    if not data and not raw.message_complete:
        raise HTTPConnectionClosed("connection closed mid-stream.")
    return t


def _discard(raw: Any) -> None:
    """Close a half-read response's socket and free its pool slot (returned, it would corrupt the next request)."""
    pool, sock = getattr(raw, "_pool", None), getattr(raw, "_sock", None)
    raw._sock = raw._pool = None
    if sock is None:
        return
    if pool is not None:
        pool.release_socket(sock)
    else:
        sock.close()


def _error_body(resp: Any, raw: Any) -> bytes:
    """An error response's first bytes: Locust has read the body already when it judged the status (its
    `_cached_content`), else from the stream."""
    cached = getattr(resp, "_cached_content", None)
    if isinstance(cached, bytes):
        return cached[:4096]
    try:
        return bytes(raw.read(4096))
    except Exception:  # noqa: BLE001 - the status alone still says what happened
        return b""
