"""One keep-alive HTTP/1.1 connection of the kernel-stamped reader and the parse state of the
response it is reading: `recvmsg` with the kernel's receive stamp, chunked framing, SSE events,
tokens counted by `sse_scan` (the client around it: `itlbench.load.clients.kernel`)."""


from __future__ import annotations

import asyncio
import socket
import time
from typing import Protocol

from itlbench.load.clients.http1 import (
    MAX_HEAD_BYTES,
    ChunkedDecoder,
    ProtocolError,
    ResponseHead,
    parse_head,
)
from itlbench.load.clients.kclock import (
    ANCILLARY_SIZE,
    SCM_TIMESTAMPNS,
    TIMESPEC,
    KernelClock,
)
from itlbench.load.clients.sse import CHUNK_ROWS_PER_HANDOFF, HEAD_BYTES, _Exchange, error_text
from itlbench.load.clients.sse_events import DEFAULT_MAX_EVENT_BYTES, SseEvents, StreamError
from itlbench.load.clients.sse_scan import DECODE, Shape, count_tokens, json_text

_now = time.perf_counter_ns
_unpack_timespec = TIMESPEC.unpack_from
SOL_SOCKET = socket.SOL_SOCKET
READ_SIZE = 64 * 1024  # under glibc's mmap threshold: a larger buffer costs an mmap per read
ERROR_BODY_BYTES = 4096


class ConnectionOwner(Protocol):
    """What a connection reports to: the client that pools it and records its events."""

    clock: KernelClock

    def _discard(self, conn: KernelConnection) -> None: ...

    def _on_event(self, payload: bytes, t: int, ex: _Exchange) -> None: ...


class KernelConnection:
    """One keep-alive connection and the parse state of the response it is reading."""

    __slots__ = ("sock", "fd", "client", "ex", "done", "head", "raw", "body", "decoder", "left",
                 "sse", "error_body", "stamped", "got_bytes", "reused", "shape", "unshaped", "fast",
                 "idle_since")

    def __init__(self, sock: socket.socket, client: ConnectionOwner, stamped: bool) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.stamped = stamped  # the kernel accepted SO_TIMESTAMPNS
        self.reused = False
        self.idle_since = 0  # perf_counter_ns when it went back to the pool
        self.ex: _Exchange | None = None
        self.done: asyncio.Future[ResponseHead] | None = None
        self._reset()

    def _reset(self) -> None:
        self.head: ResponseHead | None = None
        self.raw = b""  # response head bytes so far
        self.body = False
        self.decoder: ChunkedDecoder | None = None
        self.left = -1  # Content-Length bytes still due; -1: none (chunked or close-delimited)
        # the SSE splitter the aiohttp reader uses: the same events from the same bytes, the same cap
        self.sse = SseEvents(getattr(getattr(self.client, "target", None), "max_event_bytes", DEFAULT_MAX_EVENT_BYTES))
        self.error_body: list[bytes] | None = None
        self.got_bytes = False
        self.shape: Shape | None = None  # the learnt content chunk of this response (sse_scan.Shape)
        self.unshaped = False  # learning failed once: do not try again for this response
        self.fast = False  # between HTTP chunks and SSE events, with a learnt shape: try `_fast`

    def begin(self, ex: _Exchange, done: asyncio.Future[ResponseHead]) -> None:
        self._reset()
        self.ex, self.done = ex, done

    def on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(READ_SIZE, ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.fail(e)
            return
        t_read = _now()
        if self.ex is None:  # idle in the pool: the server closed it (or sent junk); drop it
            self.client._discard(self)
            return
        if not data:
            self._eof()
            return
        t = t_read
        if anc:
            level, kind, cdata = anc[0]
            if kind == SCM_TIMESTAMPNS and level == SOL_SOCKET:
                sec, nsec = _unpack_timespec(cdata)
                t = self.client.clock.stamp(sec * 1_000_000_000 + nsec, t_read)
        if not (self.fast and self._fast(data, t, t_read)):
            self._general(data, t, t_read)

    def feed(self, data: bytes, t: int, t_read: int) -> None:
        """Bytes of one read, stamped `t` (kernel) and `t_read` (when the read returned)."""
        if not (self.fast and self._fast(data, t, t_read)):
            self._general(data, t, t_read)

    def _general(self, data: bytes, t: int, t_read: int) -> None:
        try:
            if self.body:
                self._body(data, t, t_read)
            else:
                self._head(data, t, t_read)
        except Exception as e:  # noqa: BLE001 - a bad response ends this exchange, not the reader
            self.fail(e)

    def _fast(self, data: bytes, t: int, t_read: int) -> bool:
        """The common read, taken whole: one HTTP chunk holding one `data:` event of the learnt shape
        with a non-empty, plain text (what the chunked decoder, SseEvents and Shape.count would make of
        it, checked by the same rules without building their pieces). False: take the general path."""
        n = len(data)
        eol = data.find(b"\r\n", 0, 10)
        if eol <= 0 or not data.endswith(b"\n\n\r\n") or not data.startswith(b"data: ", eol + 2):
            return False
        try:
            size = int(data[:eol], 16)
        except ValueError:
            return False
        shape: Shape = self.shape  # type: ignore[assignment]  # `fast` implies a learnt shape
        start, end = eol + 8, n - 4  # the event's payload (after "data: ", before "\n\n")
        text, text_end = start + shape.lp, end - shape.ls
        # the shape's own bytes hold no CR or LF (Shape.learn), and a JSON string's text holds none raw (json_text)
        if (size != n - eol - 4 or text_end <= text or not data.startswith(shape.prefix, start)
                or not data.endswith(shape.suffix, 0, end) or data.find(b'"', text, text_end) >= 0
                or data[text_end - 1] == 92 or not json_text(data, text, text_end)):
            return False
        ex: _Exchange = self.ex  # type: ignore[assignment]
        client = self.client
        times = ex.times
        client.recent_itl_ns.append(t - times[-1])
        ex.read_times.append(t_read)  # type: ignore[union-attr]  # set with the first chunk
        times.append(t)
        ex.counts.append(1)
        ex.tokens += 1
        ex.events += 1
        if ex.first_answer_ns is None:  # the learnt shape is an answer chunk's; reasoning came before it
            ex.first_answer_ns = t
        if len(times) - ex.chunks_written >= CHUNK_ROWS_PER_HANDOFF:
            client._write_chunks(ex, final=False)
        if client.observer is not None:
            client.observer.on_chunk(ex, t, 1)
        return True

    def _head(self, data: bytes, t: int, t_read: int) -> None:
        self.got_bytes = True  # (the body's reads need not say it again)
        raw = self.raw + data if self.raw else data
        end = raw.find(b"\r\n\r\n")
        cap = getattr(getattr(self.client, "target", None), "max_head_bytes", MAX_HEAD_BYTES)
        if end < 0 or end > cap:
            if len(raw) > cap:
                raise StreamError("head_too_large", f"response head longer than {cap} bytes")
            self.raw = raw
            return
        head = parse_head(raw[:end])
        rest = raw[end + 4:]
        self.raw = b""
        if 100 <= head.status < 200:  # interim response: the real one follows
            if rest:
                self._head(rest, t, t_read)
            return
        self.head, self.body = head, True
        assert self.ex is not None
        self.ex.http_status = head.status
        if head.status != 200:
            self.error_body = []
        else:
            self.ex.content_type = head.content_type
        if head.chunked:
            self.decoder = ChunkedDecoder()
        elif head.length is not None:
            self.left = head.length
        if rest or head.length == 0:
            self._body(rest, t, t_read)

    def _body(self, data: bytes, t: int, t_read: int) -> None:
        dec = self.decoder
        if dec is not None:
            payload = dec.feed(data)
            finished = dec.done
        elif self.left >= 0:
            if len(data) > self.left:
                raise ProtocolError("more body bytes than Content-Length")
            payload = data
            self.left -= len(data)
            finished = self.left == 0
        else:
            payload, finished = data, False
        if payload:
            if self.error_body is not None:
                if sum(map(len, self.error_body)) < ERROR_BODY_BYTES:
                    self.error_body.append(payload)
            else:
                ex: _Exchange = self.ex  # type: ignore[assignment]
                if len(ex.head) < HEAD_BYTES:
                    ex.head += payload[:HEAD_BYTES - len(ex.head)]
                self._events(payload, t, t_read)
        if finished:
            self._finish()
        else:
            self.fast = (self.shape is not None and dec is not None and dec.left == 0 and not dec.raw
                         and not dec.trailers and not self.sse.pending and self.error_body is None
                         and len(self.ex.head) >= HEAD_BYTES)  # type: ignore[union-attr]

    def _events(self, piece: bytes, t: int, t_read: int) -> None:
        """Count the tokens of the SSE events this piece completes; each gets stamp `t`."""
        try:
            payloads = self.sse.feed(piece)
        except StreamError as e:  # the events the piece ended before the bad one are still the server's
            if e.events:
                self._events_of(e.events, t, t_read)
            raise
        if payloads:
            self._events_of(payloads, t, t_read)

    def _events_of(self, payloads: list[bytes], t: int, t_read: int) -> None:
        ex = self.ex
        assert ex is not None
        client = self.client
        client._t_read = t_read
        shape = self.shape
        for payload in payloads:
            n = shape.count(payload) if shape is not None else DECODE
            if n < 0:
                n = self._slow_count(payload, t, ex)
                shape = self.shape
            else:
                ex.events += 1
            if n > 0:  # counted by the scan: an answer chunk (the scan leaves reasoning to the JSON path)
                if ex.first_answer_ns is None:
                    ex.first_answer_ns = t
                client._add_chunk(ex, t, n)

    def _slow_count(self, payload: bytes, t: int, ex: _Exchange) -> int:
        """Tokens to add for an event the learnt shape does not match; 0 when the JSON path took it."""
        if payload == b"[DONE]" or ex.server_id is None:
            self.client._on_event(payload, t, ex)  # ([DONE] too: one place says what it means)
            return 0
        n = count_tokens(payload)
        if n < 0:
            self.client._on_event(payload, t, ex)
            return 0
        ex.events += 1
        if n == 1 and self.shape is None and not self.unshaped:
            self.shape = Shape.learn(payload)
            self.unshaped = self.shape is None
        return n

    def _finish(self) -> None:
        """The response body is complete."""
        ex, head = self.ex, self.head
        assert ex is not None and head is not None
        if self.error_body is not None:
            ex.error = error_text(head.status, b"".join(self.error_body)[:ERROR_BODY_BYTES], head.content_type)
            ex.retry_after = head.retry_after
        else:
            ex.leftover = self.sse.pending
        done = self.done
        self.ex, self.done, self.fast = None, None, False
        if done is not None and not done.done():
            done.set_result(head)

    def _eof(self) -> None:
        head = self.head
        if self.body and head is not None and self.decoder is None and head.length is None:
            head.keep_alive = False  # close-delimited body: the close is its end
            self._finish()
            return
        where = "before the response head" if not self.body else "mid-response"
        self.fail(ConnectionResetError(f"server closed the connection {where}"))

    def fail(self, exc: BaseException) -> None:
        done = self.done
        self.ex, self.done, self.fast = None, None, False
        self.client._discard(self)
        if done is not None and not done.done():
            done.set_exception(exc)
