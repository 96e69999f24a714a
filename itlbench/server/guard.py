"""Slow clients: a cap on open connections and a deadline for a request's head.

aiohttp waits for a request head as long as its keep-alive timeout (75 s), however slowly the bytes
come, and accepts connections until the process runs out of file descriptors, so a few hundred
clients trickling a header byte at a time ("slowloris") shut everyone else out. Here every
connection passes through `GuardedProtocol`:

- beyond `max_connections` open ones, a new connection gets `503` and is closed at once;
- from its first byte (or from being opened) a request's head must be complete within
  `head_timeout_s`, else `408` and the connection is closed. The clock stops when the app sees the
  request (`request_started`, from a middleware) and restarts only when the next request's first
  byte arrives, so a long generation being streamed, or a keep-alive connection idle between
  requests (aiohttp's keep-alive timeout governs those), is never cut.

The body's own deadline is the handler's (`app.read_body`): only it knows when the body is whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from itlbench.errors import ConfigError

log = logging.getLogger("itlbench.server")

DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_HEAD_TIMEOUT_S = 10.0  # a head is a few hundred bytes: seconds even over a poor link
DEFAULT_BODY_TIMEOUT_S = 60.0  # a 4 MiB body at 70 kB/s
FD_RESERVE = 128  # descriptors kept for the engine, logs, files and the listening socket

_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n")
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n")


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections may be open, and how long a request's head and body may take."""

    max_connections: int | None = None  # None: DEFAULT_MAX_CONNECTIONS, or fewer when descriptors are
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def check(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError("--max-connections", f"must be at least 1, got {self.max_connections}")
        for flag, value in (("--head-timeout", self.head_timeout_s), ("--body-timeout", self.body_timeout_s)):
            if not value > 0:
                raise ConfigError(flag, f"must be > 0 seconds, got {value}")

    @property
    def connections(self) -> int:
        return self.max_connections if self.max_connections is not None else default_max_connections()


def default_max_connections() -> int:
    """DEFAULT_MAX_CONNECTIONS, or what the descriptor limit leaves room for: past it the accept
    loop would fail anyway, for everyone."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft - FD_RESERVE))


def _reply(template: bytes, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()
    return template % len(body) + body


class ConnectionGuard:
    """Counts open connections and hands each new one its `GuardedProtocol`."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.max_connections = limits.connections
        self.open = 0
        self.refused = 0
        self.timed_out = 0

    def protocol(self, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        return GuardedProtocol(self, factory)


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the cap and the head deadline."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard, self._factory = guard, factory
        self._inner: Any = None  # aiohttp's RequestHandler, made only for an admitted connection
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_head = True  # the head deadline runs
        self._busy = False  # the app is handling a request: bytes now are its body, or pipelined

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        guard = self._guard
        if guard.open >= guard.max_connections:
            guard.refused += 1
            self._close(_REFUSED, f"this server is at its cap of {guard.max_connections} open connections; "
                                  "retry later (itlbench serve --max-connections raises it)")
            return
        guard.open += 1
        self._inner = self._factory()
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if not self._busy and not self._waiting_head:  # the first byte of the next request's head
            self._waiting_head = True
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._inner is not None:
            self._guard.open -= 1
            self._inner.connection_lost(exc)
            self._inner = None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def request_started(self) -> None:
        """The app has the request's head: the head deadline stops until the next request."""
        self._waiting_head, self._busy = False, True
        self._disarm()

    def request_finished(self) -> None:
        self._busy = False

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.limits.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self._waiting_head and self._transport is not None and not self._transport.is_closing():
            self._guard.timed_out += 1
            self._close(_TIMED_OUT, f"request head not received within {self._guard.limits.head_timeout_s:g} s "
                                    "(itlbench serve --head-timeout raises it)")

    def _close(self, template: bytes, message: str) -> None:
        assert self._transport is not None
        self._transport.write(_reply(template, message))
        self._transport.close()


@contextlib.contextmanager
def client_gone_quietly() -> Iterator[None]:
    """A write to a client that has left raises ConnectionResetError when the socket failed before aiohttp
    saw the close (which otherwise cancels the handler): a client leaving mid-stream is ordinary, and let
    through, aiohttp logs it as an ERROR with a traceback. Whoever wraps this returns its response as is;
    the request itself is aborted on the way out (app.py's `_admitted`)."""
    try:
        yield
    except ConnectionResetError:
        log.debug("client went away mid-response")


@web.middleware
async def guard_middleware(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Tells the connection's guard when its request's head has arrived and when it has been handled."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    if not isinstance(protocol, GuardedProtocol):
        return await handler(request)
    protocol.request_started()
    try:
        return await handler(request)
    finally:
        protocol.request_finished()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections pass through a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        factory = self._runner.server
        assert factory is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self.guard.protocol(factory), self._host, self._port, backlog=self._backlog)


def listen_error(host: str, port: int, exc: OSError) -> ConfigError:
    """Why this server cannot listen at host:port, as the one-line error naming the flag to change."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return ConfigError("--port", f"{where} is already in use",
                           "stop what listens there, pick another port, or give 0 for a free one")
    if exc.errno == errno.EACCES:
        return ConfigError("--port", f"not allowed to listen on {where}", "ports below 1024 need root; pick a higher one")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError("--host", f"{host} is not an address of this machine", "give 127.0.0.1, 0.0.0.0 or one of its own")
    return ConfigError("--host", f"cannot listen on {where}: {exc.strerror or exc}", "check --host and --port")


def check_listen(host: str, port: int) -> None:
    """Fail before the engine loads (minutes for a large model) when the address cannot be bound.

    Binds with SO_REUSEADDR as asyncio's server does, so a port held by a live listener fails here
    and one left in TIME_WAIT does not."""
    if not 0 <= port <= 65535:
        raise ConfigError("--port", f"must be 0-65535, got {port}", "0 picks a free port")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigError("--host", f"cannot resolve {host!r}: {exc.strerror}",
                          "give an address such as 127.0.0.1 or 0.0.0.0") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise listen_error(host, port, exc) from None
