"""The engine process's wire format: framed pickles over a Unix socketpair (never a network socket).

Frame: 8-byte little-endian length, then a pickle. Front end -> core: ("config", EngineConfig,
threads) once, then ("add", id, prompt, sampling, arrival_ns), ("abort", id, reason, num_output_tokens)
(reason "stop": a stop string ended it after that many tokens), ("stop",). Core -> front end: ("hello", info)
or ("error", error) once, then ("step", replies, outputs, records, finish_times, state), ("failed", ids,
message) and, last, ("dead", message) when its loop dies. The socket is anonymous and shared only with the
child the front end started, so both ends are trusted.
"""

from __future__ import annotations

import asyncio
import pickle
import select
import socket
import struct
from collections.abc import Sequence
from typing import Any

from itlbench.errors import ConfigError, ItlbenchError

HEADER = struct.Struct("<Q")


def frame(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def error_tuple(exc: BaseException) -> tuple[str, ...]:
    """Exceptions cross as plain tuples: ConfigError's constructor does not round-trip through pickle."""
    if isinstance(exc, ConfigError):
        return ("config", exc.field, exc.problem, exc.fix)
    return ("other", f"{type(exc).__name__}: {exc}")


def error_from(t: Sequence[str]) -> Exception:
    if t[0] == "config":
        return ConfigError(t[1], t[2], t[3])
    return ItlbenchError(t[1])


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """One message from the front end's side of the socket."""
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(n))


class Channel:
    """Blocking framed messages over the socket; `receive` drains what has arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def send(self, message: object) -> None:
        self.sock.sendall(frame(message))

    def receive(self, timeout: float | None) -> list[Any] | None:
        """Messages available now; waits up to `timeout` (None: forever) for the first. None at EOF."""
        messages: list[Any] = []
        while True:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return messages
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self._buf += data
            messages.extend(self._parse())
            if messages:
                timeout = 0.0  # got something: take the rest without waiting

    def _parse(self) -> list[Any]:
        out, buf, pos = [], self._buf, 0
        while len(buf) - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, pos)
            if len(buf) - pos - HEADER.size < n:
                break
            start = pos + HEADER.size
            out.append(pickle.loads(buf[start:start + n]))
            pos = start + n
        del buf[:pos]
        return out
