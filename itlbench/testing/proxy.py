"""A fault-injecting TCP proxy for tests, on loopback: what a broken network does to a stream.

Every byte from the server to the client can be delayed (`latency_s` plus up to `jitter_s`, order
kept), rate-limited (`bandwidth_bps`), and the response to every `every`-th request (counted over
all connections, so keep-alive connections are hit too) cut after a number of its bytes in one of
three ways: `reset_after` (an RST to the client, as a dead middlebox sends),
`half_close_after` (a FIN to the client while the server thinks the stream is fine) or
`black_hole_after` (nothing more, ever, with both connections left open: only a timeout ends it).
The client's bytes reach the server untouched. `only` limits the cuts to requests whose request line
holds it (e.g. "/completions": the load's streams, not the run's probes or its step-log follower);
delays and the bandwidth limit apply to every connection, as a network's would.

`Proxy.delivered` keeps, per connection, exactly the bytes the client was given (`_Conn.writes`:
when and how many), so a test can check that every chunk the proxy delivered is in the client's
records (`delivered_responses` splits a connection's bytes into its responses).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from itlbench.load.clients.deltas import choice_kind


@dataclass(frozen=True)
class Faults:
    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth_bps: float = 0.0  # bytes a second to the client; 0: unlimited
    reset_after: int = -1  # bytes to the client after which it gets an RST
    half_close_after: int = -1  # ... a FIN (the server side is closed too)
    black_hole_after: int = -1  # ... nothing more, connections kept open
    every: int = 1  # the cuts hit requests 0, every, 2*every, ... (the others pass clean)
    seed: int = 0
    only: str = ""  # cut only requests whose request line contains this (counted among them)

    def cut(self, n: int) -> tuple[str, int] | None:
        """(kind, after bytes) of the cut for request `n`, or None."""
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
    requests: list[bytes] = field(default_factory=list)  # the request lines the client sent
    cut_at: tuple[str, int] | None = None  # (kind, offset in `delivered`) of the cut to come
    writes: list[tuple[int, int]] = field(default_factory=list)  # (perf_counter_ns after the write, bytes)


class Proxy:
    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        self.upstream, self.faults = upstream, faults
        self.conns: list[_Conn] = []
        self._rng = random.Random(faults.seed)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._eligible = 0  # requests the cuts may hit (`Faults.only`)

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
            self._tasks.discard(task)
            return
        up = asyncio.create_task(self._pump_up(conn, c_reader, s_writer))
        try:
            await self._pump_down(conn, s_reader, c_writer, up)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            up.cancel()
            for w in (s_writer, c_writer):
                w.close()
            self._tasks.discard(task)

    def _on_request(self, conn: _Conn, data: bytes) -> None:
        """A request starts (HTTP/1.1 without pipelining: its response starts at the next byte down)."""
        line = data.split(b"\r\n", 1)[0]
        conn.requests.append(line)
        if conn.cut is None:
            conn.cut_at = None  # the previous response ended before its cut: it passed clean
        if self.faults.only and self.faults.only.encode() not in line:
            return
        cut = self.faults.cut(self._eligible)
        self._eligible += 1
        if cut is not None and conn.cut_at is None:
            conn.cut_at = (cut[0], len(conn.delivered) + cut[1])

    async def _pump_up(self, conn: _Conn, c_reader: asyncio.StreamReader, s_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await c_reader.read(65536):
                if data.startswith((b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ")):
                    self._on_request(conn, data)
                s_writer.write(data)
                await s_writer.drain()
            s_writer.write_eof()

    async def _pump_down(self, conn: _Conn, s_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                         up: asyncio.Task[None]) -> None:
        f = self.faults
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
                cut = conn.cut_at
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
        conn.writes.append((time.perf_counter_ns(), len(data)))
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


@contextlib.contextmanager
def spawn_proxy(upstream_url: str, faults: Faults, log: Path) -> Iterator[tuple[list[_Conn], str]]:
    """`serve_proxy` in its own process, so it shares no interpreter (and no GIL) with the client
    under test; yields (the connections, filled in when the block ends, the URL through the proxy)."""
    u = urlsplit(upstream_url)
    proc = subprocess.Popen([sys.executable, "-m", "itlbench.testing.proxy", upstream_url,
                             json.dumps(asdict(faults)), str(log)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"proxy did not start: {line!r}")
    conns: list[_Conn] = []
    try:
        yield conns, upstream_url.replace(f"{u.hostname}:{u.port}", f"127.0.0.1:{int(line.split()[1])}", 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    for c in json.loads(log.read_text()):
        conns.append(_Conn(c["n"], bytearray(base64.b64decode(c["delivered"])), c["cut"],
                           [r.encode("latin-1") for r in c["requests"]], None, [tuple(w) for w in c["writes"]]))


def _main(argv: list[str]) -> None:
    """python -m itlbench.testing.proxy UPSTREAM_URL FAULTS_JSON LOG: serve until SIGTERM, then write
    every connection (its bytes base64) to LOG."""
    url, faults, log = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with serve_proxy(url, Faults(**json.loads(faults))) as (proxy, via):
        print(f"PORT {urlsplit(via).port}", flush=True)
        stop.wait()
    Path(log).write_text(json.dumps([{"n": c.n, "cut": c.cut, "requests": [r.decode("latin-1") for r in c.requests],
                                      "delivered": base64.b64encode(bytes(c.delivered)).decode(),
                                      "writes": c.writes} for c in proxy.conns]))


@dataclass(frozen=True)
class Delivered:
    """One HTTP response as far as the client was given it."""

    server_id: str | None  # the first event's `id`
    chunks: int  # complete SSE events carrying a token (the client's chunk rows)
    complete: bool  # the body's end was delivered


def delivered_responses(raw: bytes) -> list[Delivered]:
    """The responses in the bytes one connection delivered (keep-alive: several), each body's
    content chunks counted as the client counts them (token ids, or any text, reasoning or tool call)."""
    out: list[Delivered] = []
    pos = 0
    while (head_end := raw.find(b"\r\n\r\n", pos)) >= 0:
        head = raw[pos:head_end].lower()
        body, pos, complete = _body(raw, head, head_end + 4)
        out.append(_count(body, complete))
    return out


def _body(raw: bytes, head: bytes, start: int) -> tuple[bytes, int, bool]:
    """(payload, where the next response starts, whether the body ended) of one response."""
    if b"transfer-encoding: chunked" not in head:
        for line in head.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                end = start + int(line.split(b":", 1)[1])
                return raw[start:end], end, end <= len(raw)
        return raw[start:], len(raw), False
    parts: list[bytes] = []
    p = start
    while (eol := raw.find(b"\r\n", p)) >= 0:
        size = int(raw[p:eol].split(b";")[0], 16)
        if size == 0:
            return b"".join(parts), eol + 4, eol + 4 <= len(raw)
        parts.append(raw[eol + 2:eol + 2 + size])
        p = eol + 2 + size + 2
    return b"".join(parts), len(raw), False


def _count(body: bytes, complete: bool) -> Delivered:
    sid, n = None, 0
    events = body.replace(b"\r\n", b"\n").split(b"\n\n")
    for event in events[:-1]:  # the last piece is an event not yet ended (or empty)
        for line in event.split(b"\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            try:
                obj = json.loads(line[5:])
            except ValueError:
                continue
            sid = sid or obj.get("id")
            for c in obj.get("choices") or []:
                ids = c.get("token_ids")
                n += bool((isinstance(ids, list) and ids) or choice_kind(c))
    return Delivered(sid if isinstance(sid, str) else None, n, complete)


if __name__ == "__main__":
    _main(sys.argv[1:])
