"""The kernel reader's HTTP/1.1: request head, response head, chunked bodies split anywhere."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.errors import ConfigError
from itlbench.load.clients.http1 import ChunkedDecoder, ProtocolError, endpoint_of, parse_head, request_head


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n" + trailers + b"\r\n"


def feed_split(data: bytes, cuts: list[int]) -> tuple[bytes, bool]:
    dec = ChunkedDecoder()
    out, prev = [], 0
    for c in [*sorted(set(cuts)), len(data)]:
        out.append(dec.feed(data[prev:c]))
        prev = c
    return b"".join(out), dec.done


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.binary(min_size=0, max_size=300), max_size=8), data=st.data())
def test_chunked_body_split_anywhere(pieces: list[bytes], data: st.DataObject) -> None:
    raw = chunked(pieces, trailers=b"X-Trailer: 1\r\n" if len(pieces) % 2 else b"")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    body, done = feed_split(raw, cuts)
    assert body == b"".join(pieces) and done


def test_chunked_every_single_split_and_byte_by_byte() -> None:
    raw = chunked([b"data: {\"a\":1}\n\n", b"data: [DONE]\n\n"]) + b"HTTP/1.1 next"
    want = b"data: {\"a\":1}\n\ndata: [DONE]\n\n"
    for cut in range(len(raw)):
        body, done = feed_split(raw, [cut])
        assert body == want and done
    body, done = feed_split(raw, list(range(len(raw))))
    assert body == want and done


def test_chunk_extensions_and_bad_framing() -> None:
    assert ChunkedDecoder().feed(b"5;name=v\r\nhello\r\n") == b"hello"
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(b"zz\r\nhello\r\n")
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(b"5\r\nhelloXX")


def test_response_head() -> None:
    h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked")
    assert (h.status, h.chunked, h.length, h.keep_alive) == (200, True, None, True)
    h = parse_head(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 12\r\nConnection: close")
    assert (h.status, h.chunked, h.length, h.keep_alive) == (503, False, 12, False)
    h = parse_head(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream")  # body ends at the close
    assert (h.chunked, h.length, h.keep_alive) == (False, None, False)
    with pytest.raises(ProtocolError):
        parse_head(b"SSH-2.0-OpenSSH_9.6")


def test_request_head_and_endpoint() -> None:
    ep = endpoint_of("http://127.0.0.1:8123/v1/completions")
    head = request_head(ep, {"Content-Type": "application/json", "Authorization": "Bearer k"}, 42)
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8123\r\n")
    assert b"\r\nContent-Length: 42\r\n\r\n" in head and b"Authorization: Bearer k\r\n" in head
    assert endpoint_of("http://[::1]/v1/chat/completions").host_header == "[::1]"
    with pytest.raises(ConfigError, match="--stream-reader"):
        endpoint_of("https://api.example.com/v1/completions")
