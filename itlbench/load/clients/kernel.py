"""A lean stream reader for plain-HTTP endpoints on Linux: kernel receive stamps, byte-scanned events.

Every socket has `SO_TIMESTAMPNS` set (see `kclock`): each `recvmsg` returns the data with the kernel's
arrival stamp of its newest bytes, mapped to `perf_counter_ns`, and every SSE event the read completes
gets that stamp. The user-space time the read returned is kept beside it (`t_read_ns`), so a chunk
row says both when the bytes arrived and how late the client got to them. Several content events in
one read share its stamp and say so (`read_chunks` > 1).

The hot path per read: one `recvmsg` into a fresh bytes object, chunked framing peeled off, SSE events
split on blank lines, tokens counted by `sse_scan` (the JSON is decoded only for a stream's first
event, finishes, usage, errors and shapes the scan does not know). One epoll set for all sockets is
registered with the event loop, so a loop wake-up serves every readable socket.

Requests, their bodies, errors and records are `StreamClient`'s (this class only replaces how a
response is read); HTTP/1.1 keep-alive connections are pooled and reused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import select
import socket
import time
from typing import Any

from itlbench.errors import ConfigError
from itlbench.load.clients.http1 import (
    ChunkedDecoder,
    Endpoint,
    ProtocolError,
    ResponseHead,
    endpoint_of,
    parse_head,
    request_head,
)
from itlbench.load.clients.kclock import (
    ANCILLARY_SIZE,
    SCM_TIMESTAMPNS,
    TIMESPEC,
    KernelClock,
    enable_rx_timestamps,
    kernel_stamps_available,
)
from itlbench.load.clients.sse import (
    CHUNK_ROWS_PER_HANDOFF,
    HEAD_BYTES,
    IDLE_CONNECTION_S,
    SseEvents,
    StreamClient,
    StreamObserver,
    _Exchange,
    _unfinished,
    build_body,
    error_text,
)
from itlbench.load.clients.sse_scan import DECODE, Shape, count_tokens
from itlbench.load.sink import RowWriter
from itlbench.load.target import STREAM_READERS, Target

_now = time.perf_counter_ns
_unpack_timespec = TIMESPEC.unpack_from
SOL_SOCKET = socket.SOL_SOCKET
READ_SIZE = 64 * 1024  # under glibc's mmap threshold: a larger buffer costs an mmap per read
CONNECT_TIMEOUT_S = 30.0
ERROR_BODY_BYTES = 4096
# Under load, wake-ups that come closer than HOLD_S and serve fewer than HOLD_READS sockets each are
# held back to that spacing, so that one wake-up serves many sockets (the event loop's fixed cost per
# wake-up dominated at 500 streams). The stamps do not move; only two chunks of one stream arriving
# within it share a read (and say so).
HOLD_S = 0.001
HOLD_READS = 8


class _Conn:
    """One keep-alive connection and the parse state of the response it is reading."""

    __slots__ = ("sock", "fd", "client", "ex", "done", "head", "raw", "body", "decoder", "left",
                 "sse", "error_body", "stamped", "got_bytes", "reused", "shape", "unshaped", "fast",
                 "idle_since")

    def __init__(self, sock: socket.socket, client: KernelStreamClient, stamped: bool) -> None:
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
        self.sse = SseEvents()  # the SSE splitter the aiohttp reader uses: the same events from the same bytes
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
                t = sec * 1_000_000_000 + nsec - self.client.offset_ns
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
        # the shape's own bytes hold no CR or LF (Shape.learn), so only the text is searched for them
        if (size != n - eol - 4 or text_end <= text or not data.startswith(shape.prefix, start)
                or not data.endswith(shape.suffix, 0, end) or data.find(b'"', text, text_end) >= 0
                or data[text_end - 1] == 92 or data.find(b"\n", text, text_end) >= 0
                or data.find(b"\r", text, text_end) >= 0):
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
        if len(times) - ex.chunks_written >= CHUNK_ROWS_PER_HANDOFF:
            client._write_chunks(ex, final=False)
        if client.observer is not None:
            client.observer.on_chunk(ex, t, 1)
        return True

    def _head(self, data: bytes, t: int, t_read: int) -> None:
        self.got_bytes = True  # (the body's reads need not say it again)
        raw = self.raw + data if self.raw else data
        end = raw.find(b"\r\n\r\n")
        if end < 0:
            if len(raw) > 64 * 1024:
                raise ProtocolError("response head longer than 64 KiB")
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
        payloads = self.sse.feed(piece)
        if not payloads:
            return
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
            if n > 0:
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
            ex.error = error_text(head.status, b"".join(self.error_body)[:ERROR_BODY_BYTES])
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


class KernelStreamClient(StreamClient):
    """`StreamClient` whose chunk stamps come from the kernel; plain HTTP/1.1 on Linux only."""

    def __init__(self, target: Target, sink: RowWriter, *, limit: int = 0, recent: int = 4096,
                 observer: StreamObserver | None = None, idle_connection_s: float = IDLE_CONNECTION_S) -> None:
        super().__init__(target, sink, limit=limit, recent=recent, observer=observer,
                         idle_connection_s=idle_connection_s)
        self.endpoint: Endpoint = endpoint_of(target.url)
        self.clock = KernelClock()
        self._idle: list[_Conn] = []
        self._conns: dict[int, _Conn] = {}
        self._epoll: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._addr: tuple[int, Any] | None = None
        self._t_read = 0
        self.offset_ns = 0  # CLOCK_REALTIME − perf_counter_ns, measured at start (kclock.KernelClock)
        self._last_wake = 0
        self._held: asyncio.TimerHandle | None = None
        self.connections_opened = 0
        self.unstamped_connections = 0

    async def __aenter__(self) -> KernelStreamClient:
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._loop.add_reader(self._epoll.fileno(), self._on_ready)
        self._addr = await self._resolve()
        self.offset_ns = self.clock.start().offset_ns
        return self

    async def _resolve(self) -> tuple[int, Any]:
        """The server's address, once, before any request (an IP literal needs no lookup)."""
        host, port = self.endpoint.host, self.endpoint.port
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            assert self._loop is not None
            infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return infos[0][0], infos[0][4]
        return (socket.AF_INET6, (host, port, 0, 0)) if ip.version == 6 else (socket.AF_INET, (host, port))

    async def __aexit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.cancel()
            self._held = None
        elif self._loop is not None and self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
        for conn in list(self._conns.values()):
            self._discard(conn)
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        self.clock.check()

    def stamp_source_name(self) -> str:
        return "kernel"

    def clock_report(self) -> dict[str, int | None] | None:
        return self.clock.report.to_dict()

    def _on_ready(self) -> None:
        assert self._epoll is not None and self._loop is not None
        conns = self._conns
        ready = self._epoll.poll(0)
        for fd, _ in ready:
            conn = conns.get(fd)
            if conn is not None:
                conn.on_readable()
        now = _now()
        if now - self._last_wake < HOLD_S * 1e9 and len(ready) < HOLD_READS and self._held is None:
            self._loop.remove_reader(self._epoll.fileno())
            self._held = self._loop.call_later(HOLD_S, self._rearm)
        self._last_wake = now

    def _rearm(self) -> None:
        self._held = None
        if self._loop is not None and self._epoll is not None:
            self._loop.add_reader(self._epoll.fileno(), self._on_ready)
            self._on_ready()

    def _add_chunk(self, ex: _Exchange, t: int, n: int) -> None:
        """The parent's bookkeeping, plus when the read that completed this chunk returned."""
        reads = ex.read_times
        if reads is None:
            reads = ex.read_times = []
        reads.append(self._t_read)
        super()._add_chunk(ex, t, n)

    # --- connections -------------------------------------------------------------------------------

    async def _connect(self) -> _Conn:
        loop = self._loop
        assert loop is not None and self._epoll is not None
        assert self._addr is not None
        family, addr = self._addr
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stamped = enable_rx_timestamps(sock)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await loop.sock_connect(sock, addr)
            except TimeoutError:
                raise ConnectionError(f"connect to {self.endpoint.host}:{self.endpoint.port} timed out "
                                      f"after {CONNECT_TIMEOUT_S:g} s") from None
        except BaseException:
            sock.close()
            raise
        conn = _Conn(sock, self, stamped)
        self._conns[conn.fd] = conn
        self._epoll.register(conn.fd, select.EPOLLIN | select.EPOLLRDHUP)
        self.connections_opened += 1
        self.unstamped_connections += not stamped
        return conn

    def _owns(self, conn: _Conn) -> bool:
        """Still open (its fd number may already serve a newer connection)."""
        return self._conns.get(conn.fd) is conn

    def _discard(self, conn: _Conn) -> None:
        if not self._owns(conn):
            return
        del self._conns[conn.fd]
        if conn in self._idle:
            self._idle.remove(conn)
        if self._epoll is not None:
            try:
                self._epoll.unregister(conn.fd)
            except OSError:
                pass
        conn.sock.close()

    async def _acquire(self) -> _Conn:
        stale = _now() - int(self.idle_connection_s * 1e9)
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_since < stale:  # the server may be closing it (see sse_client.IDLE_CONNECTION_S)
                self._discard(conn)
            elif self._owns(conn):
                conn.reused = True
                return conn
        return await self._connect()

    def _release(self, conn: _Conn, head: ResponseHead) -> None:
        if head.keep_alive and self._owns(conn) and self._epoll is not None:
            conn.idle_since = _now()
            self._idle.append(conn)
        else:
            self._discard(conn)

    # --- one request -------------------------------------------------------------------------------

    async def _exchange(self, ex: _Exchange) -> None:
        assert self._loop is not None, "use KernelStreamClient as an async context manager"
        body = json.dumps(build_body(ex.plan, self.target)).encode()
        headers = self._headers
        if self.observer is not None:
            extra = self.observer.on_start(ex)
            if extra:
                headers = {**headers, **extra}
        data = request_head(self.endpoint, headers, len(body)) + body
        ex.sent_ns = _now()
        head = await self._send_and_read(ex, data, retry=True)
        if head.status != 200:  # (its error text was set when the body ended)
            ex.error_kind = "http_status"
            return
        if ex.error is None and (ex.saw_done or ex.finish_reason is not None):
            ex.status = "ok"
        elif ex.error is None:
            ex.error_kind, ex.error = _unfinished(ex)
        elif ex.error_kind is None:
            ex.error_kind = "server_error"

    async def _send_and_read(self, ex: _Exchange, data: bytes, retry: bool) -> ResponseHead:
        conn = await self._acquire()
        assert self._loop is not None
        done: asyncio.Future[ResponseHead] = self._loop.create_future()
        conn.begin(ex, done)
        try:
            sent = conn.sock.send(data)
            if sent < len(data):
                await self._loop.sock_sendall(conn.sock, data[sent:])
            head = await done
        except (ConnectionResetError, BrokenPipeError) as e:
            self._discard(conn)
            # a pooled connection the server closed while it sat idle: nothing of the request was
            # answered, so it is sent once more on a fresh connection
            if retry and conn.reused and not conn.got_bytes:
                return await self._send_and_read(ex, data, retry=False)
            raise e
        except BaseException:
            self._discard(conn)  # cancelled or failed mid-response: the connection is unusable
            raise
        self._release(conn, head)
        return head


def _why_not_kernel(url: str | None) -> str | None:
    if url is not None and not url.startswith("http://"):
        return "the endpoint is not plain http"
    return kernel_stamps_available()


def check_reader(choice: str, url: str | None) -> None:
    """ConfigError unless `choice` names a reader that can serve `url` (None: the bundled engine)."""
    if choice not in STREAM_READERS:
        raise ConfigError("--stream-reader", f"unknown reader {choice!r}", "use auto, kernel or aiohttp")
    if choice == "kernel" and (why := _why_not_kernel(url)):
        raise ConfigError("--stream-reader", f"kernel cannot be used: {why}", "use auto or aiohttp")


def select_reader(target: Target) -> str:
    """The reader `target.stream_reader` asks for, `auto` resolved for this host and endpoint."""
    check_reader(target.stream_reader, target.url)
    if target.stream_reader == "auto":
        return "aiohttp" if _why_not_kernel(target.url) else "kernel"
    return target.stream_reader


def make_stream_client(target: Target, sink: RowWriter, *, limit: int = 0,
                       observer: StreamObserver | None = None) -> StreamClient:
    """The stream client the target's `stream_reader` selects."""
    if select_reader(target) == "kernel":
        return KernelStreamClient(target, sink, limit=limit, observer=observer)
    return StreamClient(target, sink, limit=limit, observer=observer)
