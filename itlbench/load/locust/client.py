"""The streaming client inside a Locust worker: StreamClient's parsing and records over gevent.

Only the transport differs from `sse_client.StreamClient`: requests go through Locust's
`FastHttpSession` (geventhttpclient), and the body is read with `readline(b"\\n")` on the underlying
response (private attributes: geventhttpclient is pinned). Locust's own `iter_content`/`iter_lines`
would not do: they block until 1,024 bytes arrive, which bunches chunks and delays first tokens.
`readline` returns once a network read completes a line; whatever else that read brought is taken
from the response's buffer too, and all of it is stamped with that read's `perf_counter_ns`, as the
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

from itlbench.load.clients.sse import Outcome, StreamClient, _Exchange, build_body
from itlbench.load.clients.sse_events import SseEvents
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
            ex.status, ex.error = "cancelled", "cancelled (drain timeout or stop)"
            raise
        except gevent.Timeout as t:
            if t is not timer:
                raise
            ex.status, ex.error = "timeout", f"no end of stream within {self.target.timeout_s} s"
        except CONNECTION_ERRORS as e:
            ex.status, ex.error, ex.connection_error = "error", f"{type(e).__name__}: {e}", True
        except Exception as e:  # noqa: BLE001 - a bad response must not kill the run
            ex.status, ex.error = "error", f"{type(e).__name__}: {e}"
        finally:
            if timer is not None:
                timer.close()
            self._record(ex, _now())
        return Outcome(ex.status, ex.connection_error, ex.http_status, ex.tokens, ex.sent_ns,
                       ex.times[0] if ex.times else None)

    def _exchange_g(self, ex: _Exchange, session: Any) -> None:
        data = json.dumps(build_body(ex.plan, self.target)).encode()
        ex.sent_ns = _now()
        resp = session.request("POST", self.target.url, data=data, headers=self._headers, stream=True,
                               name=ex.plan.cls)
        raw = getattr(resp, "_response", None)
        if raw is None:  # no response at all: the error geventhttpclient raised (refused, reset, ...)
            raise resp.error
        ex.http_status = resp.status_code
        if ex.http_status != 200:
            ex.error = _error_message(ex.http_status, raw)
            return
        try:
            self._read_lines(raw, ex)
        finally:
            if not raw.message_complete:  # cancelled or broken mid-stream: never reuse this connection
                _discard(raw)
        if ex.error is None and (ex.saw_done or ex.finish_reason is not None):
            ex.status = "ok"
        elif ex.error is None:
            ex.error = "stream ended before [DONE]"

    def _read_lines(self, raw: Any, ex: _Exchange) -> None:
        """Wait for the next line, take with it everything that read brought, and stamp it all with
        the time the read returned (the aiohttp client's `readany` semantics), then parse."""
        events = SseEvents(self.target.max_event_bytes)
        readline = raw.readline
        t = _now()
        while True:
            fresh = raw._body_buffer.find(b"\n") < 0  # the next line needs a network read
            data = readline(b"\n")
            if fresh:
                t = _now()
            if not data:
                return
            rest = raw._body_buffer
            if rest:
                data += rest
                del rest[:]
            for payload in events.feed(data):
                self._on_event(payload, t, ex)


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


def _error_message(status: int, raw: Any) -> str:
    try:
        body = bytes(raw.read(4096)).decode(errors="replace")
    except Exception:  # noqa: BLE001 - the status alone still says what happened
        body = ""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message", err) if isinstance(err, dict) else err
        return f"HTTP {status}: {msg}"
    except ValueError:
        return f"HTTP {status}: {body.strip()[:500]}"
