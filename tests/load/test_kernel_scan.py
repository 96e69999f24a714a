"""The byte scan counts what the JSON path counts, or hands the chunk to the JSON path.

The oracle is `StreamClient._on_event`, the aiohttp reader's own event handling: for every chunk
the scan answers, the JSON path must add the same tokens and change nothing else in the record.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.load.clients.sse import StreamClient, _Exchange
from itlbench.load.clients.sse_events import StreamError
from itlbench.load.clients.sse_scan import DECODE, Shape, count_tokens
from itlbench.load.target import Target
from itlbench.workloads.plan import RequestPlan


class _Sink:
    def add(self, table: str, row: dict[str, Any]) -> None:
        pass


CLIENT = StreamClient(Target("http://127.0.0.1:9/v1", "m"), _Sink())


def oracle(payload: bytes) -> tuple[list[int], bool]:
    """(token counts the JSON path appended, whether it changed anything else in the record)."""
    ex = _Exchange(RequestPlan("r", "w", "w", 1, 8), 0, None)
    ex.server_id = "known"
    CLIENT._on_event(payload, 1, ex)
    other = (ex.finish_reason, ex.prompt_reported, ex.completion_reported, ex.error, ex.server_id)
    return ex.counts, other != (None, None, None, None, "known")


texts = st.one_of(st.just(""), st.just(" tok"), st.text(max_size=12), st.just('say "hi"\\'), st.none())
ids = st.one_of(st.just(None), st.just([]), st.lists(st.integers(0, 200_000), min_size=1, max_size=4))
finishes = st.sampled_from([None, "length", "stop", ""])
usages = st.one_of(st.just("absent"), st.none(), st.just({"prompt_tokens": 7, "completion_tokens": 3}))


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    chat = draw(st.booleans())
    choice: dict[str, Any] = {"index": 0}
    if chat:
        delta: dict[str, Any] = {}
        if draw(st.booleans()):
            delta["role"] = "assistant"
        for key in draw(st.sets(st.sampled_from(["content", "reasoning_content"]))):
            delta[key] = draw(texts)
        choice["delta"] = delta
        if draw(st.booleans()):
            choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.1}]}
    else:
        text = draw(texts)
        if text is not None or draw(st.booleans()):
            choice["text"] = text
        choice["logprobs"] = None
    token_ids = draw(ids)
    if token_ids is not None or draw(st.booleans()):
        choice["token_ids"] = token_ids
    if draw(st.booleans()):
        choice["finish_reason"] = draw(finishes)
    obj: dict[str, Any] = {"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                           "model": "m", "choices": [choice]}
    if draw(st.integers(0, 9)) == 0:
        obj["choices"] = [choice, {**choice, "index": 1}]
    if draw(st.integers(0, 9)) == 0:
        obj["choices"] = []
    u = draw(usages)
    if u != "absent":
        obj["usage"] = u
    if draw(st.integers(0, 14)) == 0:
        obj = {"error": {"message": "boom", "code": 500}}
    if draw(st.booleans()):
        keys = list(obj)
        obj = {k: obj[k] for k in draw(st.permutations(keys))}
    return obj


def dump(obj: dict[str, Any], style: int) -> bytes:
    if style == 0:
        return json.dumps(obj, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(obj).encode()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@settings(max_examples=1500, deadline=None)
@given(obj=chunks(), style=st.integers(0, 2))
def test_scan_agrees_with_the_json_path(obj: dict[str, Any], style: int) -> None:
    p = dump(obj, style)
    counts, other = oracle(p)
    n = count_tokens(p)
    if n != DECODE:
        assert not other, "the scan answered a chunk that carries more than tokens"
        assert counts == ([n] if n else [])


@settings(max_examples=800, deadline=None)
@given(first=chunks(), later=chunks(), text=st.text(max_size=12), style=st.integers(0, 2))
def test_learnt_shape_matches_only_what_the_json_path_counts_as_one(
        first: dict[str, Any], later: dict[str, Any], text: str, style: int) -> None:
    shape = Shape.learn(dump(first, style))
    if shape is None:
        return
    # the same chunk with another text, and an unrelated chunk
    same = json.loads(dump(first, style))
    c = same["choices"][0]
    if "text" in c:
        c["text"] = text
    else:
        c["delta"]["content"] = text
    for q in (dump(same, style), dump(later, style)):
        if shape.count(q) == 1:
            assert oracle(q) == ([1], False)


def _answer(payload: bytes) -> tuple[list[int], bool] | None:
    """The oracle's answer, or None where the JSON path refuses the chunk (it fails the request)."""
    try:
        return oracle(payload)
    except StreamError:
        return None


@settings(max_examples=1500, deadline=None)
@given(obj=chunks(), style=st.integers(0, 2), how=st.sampled_from(["cut", "swap", "drop"]), at=st.integers(0, 10**6),
       byte=st.sampled_from(list(b'{}[]":, \t\n\\0a\xff')))
def test_a_chunk_that_is_not_json_is_left_to_the_json_path(obj: dict[str, Any], style: int, how: str, at: int,
                                                           byte: int) -> None:
    """Cut short, a byte changed or one dropped: counted only where the JSON path takes it and counts the same."""
    p = dump(obj, style)
    i = at % len(p)
    p = p[:i] if how == "cut" else p[:i] + bytes([byte]) + p[i + 1:] if how == "swap" else p[:i] + p[i + 1:]
    n, answer = count_tokens(p), _answer(p)
    if n != DECODE:
        assert answer is not None, f"counted {n} where the JSON path refuses {p!r}"
        assert answer == ([n] if n else [], False)


@settings(max_examples=800, deadline=None)
@given(slot=st.binary(min_size=1, max_size=8))
def test_a_learnt_shape_counts_a_text_only_where_the_json_path_reads_one(slot: bytes) -> None:
    """The text between a learnt shape's bytes may be any bytes a server sends: raw control bytes, escapes JSON
    has not, bytes that are not UTF-8, a lone surrogate's escape (the stdlib reads it, orjson does not)."""
    shape = Shape.learn(REAL["vllm completions"])
    assert shape is not None
    p = shape.prefix + slot + shape.suffix
    if shape.count(p) == 1:
        assert _answer(p) == ([1], False), p
    elif b'"' not in slot and not slot.endswith(b"\\") and _answer(p) == ([1], False):
        raise AssertionError(f"a plain text the JSON path counts was refused: {slot!r}")


REAL = {
    "vllm completions": b'{"id":"cmpl-9f","object":"text_completion","created":1730000000,"model":"m","choices":'
                        b'[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}]}',
    "vllm chat": b'{"id":"chatcmpl-9f","object":"chat.completion.chunk","created":1730000000,"model":"m",'
                 b'"choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}',
    "openai chat": b'{"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o",'
                   b'"system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,'
                   b'"finish_reason":null}],"usage":null}',
    "itlbench": b'{"id":"cmpl-3","object":"text_completion","created":1730000000,"model":"cpu-small","choices":'
                b'[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"token_ids":[1996]}]}',
}


def test_real_servers_chunks_take_the_fast_paths() -> None:
    for name, p in REAL.items():
        assert count_tokens(p) == 1 == oracle(p)[0][0], name
        shape = Shape.learn(p)
        if name == "itlbench":
            continue  # its token ids change every chunk: the scan, not a shape, serves it
        assert shape is not None, name
        other = p.replace(b'" the"', b'" quick \\u00e9"')
        assert shape.count(other) == 1, name
        assert shape.count(p.replace(b'" the"', b'""')) == DECODE  # empty text: the scan decides
        assert shape.count(p.replace(b'" the"', b'"say \\"x\\""')) == DECODE  # a quote inside: ditto
    assert count_tokens(REAL["itlbench"].replace(b"[1996]", b"[1996,17,4]")) == 3
