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
import select
import socket
import time
from typing import Any

from itlbench.errors import ConfigError
from itlbench.load.clients.http1 import (
    Endpoint,
    ResponseHead,
    endpoint_of,
    request_head,
)
from itlbench.load.clients.kclock import (
    KernelClock,
    enable_rx_timestamps,
    kernel_stamps_available,
)
from itlbench.load.clients.kernel_conn import KernelConnection
from itlbench.load.clients.sse import (
    IDLE_CONNECTION_S,
    StreamClient,
    StreamObserver,
    _Exchange,
    _settle,
)
from itlbench.load.sink import RowWriter
from itlbench.load.target import STREAM_READERS, Target

_now = time.perf_counter_ns
CONNECT_TIMEOUT_S = 30.0
# Under load, wake-ups that come closer than HOLD_S and serve fewer than HOLD_READS sockets each are
# held back to that spacing, so that one wake-up serves many sockets (the event loop's fixed cost per
# wake-up dominated at 500 streams). The stamps do not move; only two chunks of one stream arriving
# within it share a read (and say so).
HOLD_S = 0.001
HOLD_READS = 8


class KernelStreamClient(StreamClient):
    """`StreamClient` whose chunk stamps come from the kernel; plain HTTP/1.1 on Linux only."""

    def __init__(self, target: Target, sink: RowWriter, *, limit: int = 0, recent: int = 4096,
                 observer: StreamObserver | None = None, idle_connection_s: float = IDLE_CONNECTION_S) -> None:
        super().__init__(target, sink, limit=limit, recent=recent, observer=observer,
                         idle_connection_s=idle_connection_s)
        self.endpoint: Endpoint = endpoint_of(target.url)
        self.clock = KernelClock()
        self._idle: list[KernelConnection] = []
        self._conns: dict[int, KernelConnection] = {}
        self._epoll: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._addr: tuple[int, Any] | None = None
        self._t_read = 0
        self._last_wake = 0
        self._held: asyncio.TimerHandle | None = None
        self.connections_opened = 0
        self.unstamped_connections = 0

    async def __aenter__(self) -> KernelStreamClient:
        self._loop = asyncio.get_running_loop()
        self._epoll = select.epoll()
        self._loop.add_reader(self._epoll.fileno(), self._on_ready)
        self._addr = await self._resolve()
        self.clock.start()
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

    async def _connect(self) -> KernelConnection:
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
        conn = KernelConnection(sock, self, stamped)
        self._conns[conn.fd] = conn
        self._epoll.register(conn.fd, select.EPOLLIN | select.EPOLLRDHUP)
        self.connections_opened += 1
        self.unstamped_connections += not stamped
        return conn

    def _owns(self, conn: KernelConnection) -> bool:
        """Still open (its fd number may already serve a newer connection)."""
        return self._conns.get(conn.fd) is conn

    def _discard(self, conn: KernelConnection) -> None:
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

    async def _acquire(self) -> KernelConnection:
        stale = _now() - int(self.idle_connection_s * 1e9)
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_since < stale:  # the server may be closing it (see sse_client.IDLE_CONNECTION_S)
                self._discard(conn)
            elif self._owns(conn):
                conn.reused = True
                return conn
        return await self._connect()

    def _release(self, conn: KernelConnection, head: ResponseHead) -> None:
        if head.keep_alive and self._owns(conn) and self._epoll is not None:
            conn.idle_since = _now()
            self._idle.append(conn)
        else:
            self._discard(conn)

    # --- one request -------------------------------------------------------------------------------

    async def _exchange(self, ex: _Exchange) -> None:
        assert self._loop is not None, "use KernelStreamClient as an async context manager"
        body, headers = self._request(ex)
        data = request_head(self.endpoint, headers, len(body)) + body
        ex.sent_ns = _now()
        head = await self._send_and_read(ex, data, retry=True)
        if head.status != 200:  # (its error text was set when the body ended)
            ex.error_kind = "http_status"
            return
        _settle(ex)

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
