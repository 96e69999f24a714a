"""The HTTP/1.1 a streaming client needs: one request head, one response head, and a response body
framed by chunked transfer encoding, Content-Length or the connection's close. Incremental: every
parser takes bytes as they arrive, split anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from itlbench.errors import ConfigError

MAX_HEAD_BYTES = 64 * 1024


class ProtocolError(ConnectionError):
    """The server's bytes are not HTTP/1.1 this client understands (a connection error)."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str
    host_header: str


def endpoint_of(url: str) -> Endpoint:
    """Host, port and path of a plain-HTTP URL."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ConfigError("--stream-reader", f"the kernel stream reader speaks plain http, not {url!r}",
                          "use --stream-reader aiohttp (or auto) for https")
    port = u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return Endpoint(u.hostname, port, path, host if port == 80 else f"{host}:{port}")


def request_head(ep: Endpoint, headers: dict[str, str], body_len: int) -> bytes:
    lines = [f"POST {ep.path} HTTP/1.1", f"Host: {ep.host_header}", "User-Agent: itlbench",
             *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {body_len}", "", ""]
    return "\r\n".join(lines).encode("latin-1")


@dataclass
class ResponseHead:
    status: int
    chunked: bool
    length: int | None  # Content-Length; None with chunked or a close-delimited body
    keep_alive: bool
    content_type: str | None = None
    retry_after: str | None = None


def parse_head(head: bytes) -> ResponseHead:
    """Status line and the headers that frame the body (everything before the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    te = headers.get("transfer-encoding", "").lower()
    chunked = "chunked" in te
    length = None
    if not chunked and "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise ProtocolError(f"bad Content-Length {headers['content-length']!r}") from None
    conn = headers.get("connection", "").lower()
    keep_alive = "close" not in conn and (parts[0] != "HTTP/1.0" or "keep-alive" in conn)
    return ResponseHead(int(parts[1]), chunked, length, keep_alive and (chunked or length is not None),
                        headers.get("content-type"), headers.get("retry-after"))


class ChunkedDecoder:
    """Transfer-Encoding: chunked, fed as bytes arrive. `feed` returns the payload bytes it could
    decode (possibly empty); `done` turns True after the last chunk and its trailers."""

    __slots__ = ("left", "raw", "done", "trailers")

    def __init__(self) -> None:
        self.left = 0  # >0: payload bytes still due in this chunk; -1: its CRLF is due; 0: a size line is due
        self.raw = b""  # an incomplete size line or CRLF carried to the next feed
        self.done = False
        self.trailers = False

    def feed(self, data: bytes) -> bytes:
        if self.raw:
            data = self.raw + data
            self.raw = b""
        left = self.left
        n = len(data)
        # the common cases: one whole chunk, or the rest of one, and nothing after it
        if left == 0 and not self.trailers:
            eol = data.find(b"\r\n")
            if 0 < eol < 9 and data.endswith(b"\r\n"):
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = 0
                if size and n == eol + size + 4:
                    return data[eol + 2:n - 2]
        elif left > 0 and n == left + 2 and data.endswith(b"\r\n"):
            self.left = 0
            return data[:left]
        out: list[bytes] = []
        pos = 0
        while pos < n and not self.done:
            if left > 0:
                end = pos + left
                if end > n:
                    out.append(data[pos:])
                    left -= n - pos
                    pos = n
                else:
                    out.append(data[pos:end])
                    pos, left = end, -1
            elif left == -1:
                if n - pos < 2:
                    self.raw = data[pos:]
                    break
                if data[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos, left = pos + 2, 0
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise ProtocolError("chunk size line too long")
                    self.raw = data[pos:]
                    break
                line = data[pos:eol]
                pos = eol + 2
                if self.trailers:  # trailer lines until the empty one
                    if not line:
                        self.done = True
                    continue
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    self.trailers = True
                else:
                    left = size
        self.left = left
        if len(out) == 1:
            return out[0]
        return b"".join(out)
