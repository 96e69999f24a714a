"""Streams of every shape count from their first delta: reasoning (`reasoning`, `reasoning_content`),
tool-call fragments and content parts, through both stream readers, against a test peer that streams
each shape; the first answer token is recorded apart from the first token."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlbench.load.clients.deltas import choice_kind
from itlbench.load.clients.sse_scan import DECODE, count_tokens
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread
from tests.support.load import closed, run, table

SHAPES = [("reasoning", "content"), ("reasoning_content", "content"), ("reasoning", "tool_calls"),
          ("reasoning_content", "parts")]


@pytest.mark.parametrize("reader", ["kernel", "aiohttp"])
@pytest.mark.parametrize(("field", "answer"), SHAPES)
def test_every_delta_counts_and_the_answer_starts_after_the_reasoning(tmp_path: Path, reader: str, field: str,
                                                                      answer: str) -> None:
    cfg = PeerConfig(tick_s=0.005, reasoning_chunks=6, reasoning_field=field, answer_shape=answer)
    with serve_in_thread(cfg) as (_, url):
        run(closed(2, 20), url, tmp_path, target_kw={"api": "chat", "stream_reader": reader}, duration_s=0.6)
    req = table(tmp_path, "requests").filter(status="ok")
    assert req.height >= 2
    assert req["output_tokens"].to_list() == [20] * req.height  # every chunk counted, reasoning included
    assert req["reasoning_chunks"].to_list() == [6] * req.height
    chunks = table(tmp_path, "chunks")
    for row in req.iter_rows(named=True):
        times = chunks.filter(request_id=row["request_id"]).sort("index")["t_ns"].to_list()
        assert row["first_token_ns"] == times[0]  # TTFT from the first reasoning delta
        assert row["first_answer_ns"] == times[6]  # the seventh chunk is the answer's first


@pytest.mark.parametrize("reader", ["kernel", "aiohttp"])
def test_plain_content_streams_have_their_first_answer_at_the_first_token(tmp_path: Path, reader: str) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.005)) as (_, url):
        run(closed(2, 10), url, tmp_path, target_kw={"api": "chat", "stream_reader": reader}, duration_s=0.4)
    req = table(tmp_path, "requests").filter(status="ok")
    assert req.height >= 2
    assert (req["first_answer_ns"] == req["first_token_ns"]).all() and (req["reasoning_chunks"] == 0).all()


@pytest.mark.parametrize(("delta", "kind"), [
    ({"content": "a"}, "answer"), ({"content": ""}, None), ({"role": "assistant"}, None),
    ({"reasoning": "a"}, "reasoning"), ({"reasoning_content": "a", "content": None}, "reasoning"),
    ({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, "answer"), ({"tool_calls": []}, None),
    ({"content": [{"type": "text", "text": "a"}]}, "answer"), ({"content": [{"type": "text", "text": ""}]}, None),
])
def test_delta_kinds(delta: dict, kind: str | None) -> None:
    assert choice_kind({"delta": delta}) == kind


def test_the_byte_scan_leaves_reasoning_and_tool_calls_to_the_json_path() -> None:
    for delta in (b'{"reasoning":"a"}', b'{"reasoning_content":"a"}', b'{"tool_calls":[{"index":0}]}'):
        chunk = b'{"id":"x","choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}'
        assert count_tokens(chunk) == DECODE
    assert count_tokens(b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}') == 1
