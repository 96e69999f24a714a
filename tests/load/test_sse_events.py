"""The SSE splitter on its general path: CRLF and CR line ends, multi-line data, comments, other
fields, empty events, and events cut anywhere across network reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.load.clients.sse_events import SseEvents

STREAM = (
    b": keep-alive comment\r\n\r\n"
    b"data: {\"a\": 1}\r\n\r\n"
    b"event: message\nid: 7\ndata: {\"b\":\ndata:  2}\n\n"
    b"retry: 100\n\n"
    b"data:\n\n"
    b"data:{\"c\": 3}\r\rdata: [DONE]\n\n"
)
EXPECTED = [b'{"a": 1}', b'{"b":\n 2}', b'{"c": 3}', b"[DONE]"]


def test_general_events_in_one_read():
    assert SseEvents().feed(STREAM) == EXPECTED


def test_an_unfinished_event_waits_for_its_blank_line():
    events = SseEvents()
    assert events.feed(b"data: {\"x\": 1}\n") == []
    assert events.feed(b"\n") == [b'{"x": 1}']
    assert events.feed(b"data: [DONE]\r") == []
    assert events.feed(b"\n\r\n") == [b"[DONE]"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_across_reads_gives_the_same_events(cuts):
    events, out, prev = SseEvents(), [], 0
    for cut in [*sorted(cuts), len(STREAM)]:
        out += events.feed(STREAM[prev:cut])
        prev = cut
    assert out == EXPECTED
