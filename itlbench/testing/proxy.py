"""A fault-injecting TCP proxy for tests, on loopback: what a broken network does to a stream.

Every byte from the server to the client can be delayed (`latency_s` plus up to `jitter_s`, order
kept), rate-limited (`bandwidth_bps`), and, on every `every`-th connection, cut after a number of
bytes in one of three ways: `reset_after` (an RST to the client, as a dead middlebox sends),
`half_close_after` (a FIN to the client while the server thinks the stream is fine) or
`black_hole_after` (nothing more, ever, with both connections left open: only a timeout ends it).
The client's bytes reach the server untouched.

`Proxy.delivered` keeps, per connection, exactly the bytes the client was given, so a test can
check that every chunk the proxy delivered is in the client's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Faults:
    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth_bps: float = 0.0  # bytes a second to the client; 0: unlimited
    reset_after: int = -1  # bytes to the client after which it gets an RST
    half_close_after: int = -1  # ... a FIN (the server side is closed too)
    black_hole_after: int = -1  # ... nothing more, connections kept open
    every: int = 1  # the cuts hit connections 0, every, 2*every, ... (the others pass clean)
    seed: int = 0

    def cut(self, n: int) -> tuple[str, int] | None:
        """(kind, after bytes) of the cut for connection `n`, or None."""
        if n % max(1, self.every):
            return None
        for kind in ("reset", "half_close", "black_hole"):
            after = getattr(self, f"{kind}_after")
            if after >= 0:
                return kind, after
        return None


@dataclass
class _Conn:
    n: int
    delivered: bytearray = field(default_factory=bytearray)
    cut: str | None = None  # the fault applied, once it was


class Proxy:
    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        self.upstream, self.faults = upstream, faults
        self.conns: list[_Conn] = []
        self._rng = random.Random(faults.seed)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def delivered(self) -> list[bytes]:
        return [bytes(c.delivered) for c in self.conns]

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        conn = _Conn(len(self.conns))
        self.conns.append(conn)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            c_writer.close()
            return
        up = asyncio.create_task(self._pump_up(c_reader, s_writer))
        try:
            await self._pump_down(conn, s_reader, c_writer, up)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            up.cancel()
            for w in (s_writer, c_writer):
                w.close()
            self._tasks.discard(task)

    async def _pump_up(self, c_reader: asyncio.StreamReader, s_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await c_reader.read(65536):
                s_writer.write(data)
                await s_writer.drain()
            s_writer.write_eof()

    async def _pump_down(self, conn: _Conn, s_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                         up: asyncio.Task[None]) -> None:
        f = self.faults
        cut = f.cut(conn.n)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            while data := await s_reader.read(65536):
                delay = f.latency_s + (self._rng.uniform(0, f.jitter_s) if f.jitter_s else 0.0)
                await queue.put((time.monotonic() + delay, data))
            await queue.put((time.monotonic() + f.latency_s, b""))

        reader = asyncio.create_task(read())
        try:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    c_writer.write_eof()
                    return
                if cut is not None and len(conn.delivered) + len(data) > cut[1]:
                    data = data[: max(0, cut[1] - len(conn.delivered))]
                    await self._send(conn, c_writer, data)
                    await self._apply(conn, cut[0], c_writer, up)
                    return
                await self._send(conn, c_writer, data)
        finally:
            reader.cancel()

    async def _send(self, conn: _Conn, c_writer: asyncio.StreamWriter, data: bytes) -> None:
        if not data:
            return
        c_writer.write(data)
        await c_writer.drain()
        conn.delivered += data
        if self.faults.bandwidth_bps > 0:
            await asyncio.sleep(len(data) / self.faults.bandwidth_bps)

    async def _apply(self, conn: _Conn, kind: str, c_writer: asyncio.StreamWriter, up: asyncio.Task[None]) -> None:
        conn.cut = kind
        if kind == "reset":
            sock = c_writer.get_extra_info("socket")
            if sock is not None:  # linger 0: close sends an RST, not a FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c_writer.transport.abort()
            return
        if kind == "half_close":
            c_writer.write_eof()
        # half close: the client may still write; black hole: nothing more, ever. Both end when the
        # client leaves (the upward pump sees its end).
        await asyncio.shield(up)


@contextlib.contextmanager
def serve_proxy(upstream_url: str, faults: Faults) -> Iterator[tuple[Proxy, str]]:
    """A proxy in front of `upstream_url` (http://host:port/...), on its own loop in a thread;
    yields (proxy, the same URL through the proxy)."""
    from urllib.parse import urlsplit

    u = urlsplit(upstream_url)
    loop = asyncio.new_event_loop()
    proxy = Proxy((u.hostname or "127.0.0.1", u.port or 80), faults)
    port: list[int] = []
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        port.append(loop.run_until_complete(proxy.start()))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("proxy did not start")
    try:
        yield proxy, upstream_url.replace(f"{u.hostname}:{u.port}", f"127.0.0.1:{port[0]}", 1)
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
