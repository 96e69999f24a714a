"""Server-sent events, split from a byte stream fed in whatever pieces the network gives."""

from __future__ import annotations

from collections.abc import Callable

from itlbench.load.target import Target


class StreamError(Exception):
    """A response that breaks the streaming protocol; `kind` becomes the row's `error_kind`. `events`: the
    payloads of the events that ended before the bad one in the same read, which a caller still records."""

    def __init__(self, kind: str, message: str, events: list[bytes] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.events = events or []


DEFAULT_MAX_EVENT_BYTES = Target.max_event_bytes  # an event larger than this fails the request


class SseEvents:
    """Splits a server-sent-event byte stream, fed in whatever pieces the network gives, into the
    data payloads of its events (the WHATWG event-stream rules that OpenAI-style servers use):
    events end at a blank line; CRLF, CR and LF all end lines; an event's `data:` lines are joined
    with newlines (one optional space after the colon is dropped); comments (`:`) and other fields
    are ignored; an event whose data is empty is not dispatched. The common one-line `data: {...}`
    event takes the fast path.

    Linear in the bytes fed, whatever the pieces: line ends are normalised per piece (a CR ending
    one piece swallows an LF starting the next), the pending bytes live in one growing buffer, and
    the search for the blank line resumes where the last one stopped, so an event that never ends
    costs O(its size), not O(size²). An event larger than `max_event_bytes` raises
    StreamError("event_too_large"): an unfinished one as soon as it passes the cap (the server never ends
    it) instead of growing without bound, and a finished one too, so whether an event fails does not
    depend on how the network cut it into reads."""

    __slots__ = ("_buf", "_scan", "_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._scan = 0  # no blank line starts before this index of _buf
        self._cr = False  # the last piece ended with a CR (already taken as a line end)
        self.max_event_bytes = max_event_bytes

    @property
    def pending(self) -> int:
        """Bytes of an event not yet ended (at the end of a body: an event cut short). Cheap: a long
        buffer is counted as it is, a short one without its surrounding whitespace."""
        n = len(self._buf)
        return n if n > 4096 else len(bytes(self._buf).strip())

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        if not buf and data.endswith(b"\n\n") and data.find(b"\n\n") == len(data) - 2:
            # the common read: exactly one whole event
            if len(data) - 2 > self.max_event_bytes:
                self._too_large(len(data) - 2, "ended", [])
            return [p] if (p := _payload(data[:-2])) else []
        buf += data
        out: list[bytes] = []
        start = 0
        pos = self._scan
        while (end := buf.find(b"\n\n", pos)) >= 0:
            if end - start > self.max_event_bytes:
                self._too_large(end - start, "ended", out)
            payload = _payload(bytes(buf[start:end]))
            start = pos = end + 2
            if payload:  # an event without data (or with empty data) is not dispatched
                out.append(payload)
        if start:
            del buf[:start]
        self._scan = max(0, len(buf) - 1)  # a LF at the end may be the first of a blank line
        if len(buf) > self.max_event_bytes:
            self._too_large(len(buf), "pending without ending", out)
        return out

    def feed_each(self, data: bytes, handle: Callable[[bytes], object]) -> None:
        """`feed`, each payload to `handle`, including those that ended before a bad event in the same read (then
        the StreamError is raised)."""
        try:
            payloads = self.feed(data)
        except StreamError as e:
            for payload in e.events:
                handle(payload)
            raise
        for payload in payloads:
            handle(payload)

    def _too_large(self, size: int, state: str, before: list[bytes]) -> None:
        """Let the buffered bytes go (the request is failed) and say why, handing over the events before it."""
        self._buf.clear()
        self._scan = 0
        raise StreamError("event_too_large", f"an SSE event grew past {self.max_event_bytes} bytes ({size} {state})",
                          before)


def _payload(event: bytes) -> bytes | None:
    return event[6:] if event.startswith(b"data: ") and b"\n" not in event else _data_of(event)


def _data_of(event: bytes) -> bytes | None:
    """General SSE event: join its `data:` lines; comments and other fields are ignored."""
    parts = [line[6:] if line.startswith(b"data: ") else line[5:]
             for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None
