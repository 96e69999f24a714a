"""Token count of one streamed OpenAI chunk by byte scan, without decoding its JSON.

Gives exactly what the JSON path in `sse` counts (`len(token_ids)` when non-empty, else 1 when `text`
or the delta's `content` is a non-empty string, else 0) for the chunks that carry nothing else the record needs: one choice, `finish_reason` null, no
`usage` object, no `error`. Anything else (a finish, usage, an error, several choices, a shape it does
not know) returns -1 and the caller decodes the JSON. Keys are matched with their quotes, and a quote
inside a JSON string is always escaped, so `"text":` can only match a key.

`Shape` is the fastest path: a stream's content chunks differ only in their text, so once one chunk
is learnt (decoded and checked), a later one that starts and ends with the same bytes and has no quote
between them is the same chunk with another text: 1 token, by two comparisons and one search.
"""

from __future__ import annotations

import json
from typing import Any

from itlbench.load.clients.deltas import choice_kind, logprob_tokens

try:
    from orjson import loads as _loads
except ImportError:  # optional speed-up
    _loads = json.loads

DECODE = -1  # the scan cannot tell: decode the JSON
_WS = b" \t\r\n"


def _value(p: bytes, i: int) -> int:
    """Index of the value after a key ending at i (skips whitespace, the colon, whitespace); -1 if malformed."""
    n = len(p)
    while i < n and p[i] in _WS:
        i += 1
    if i >= n or p[i] != 58:  # ':'
        return -1
    i += 1
    while i < n and p[i] in _WS:
        i += 1
    return i if i < n else -1


def _string_state(p: bytes, key: bytes, start: int = 0) -> int:
    """For a string-valued key: 1 non-empty, 0 empty, null or absent, DECODE for anything else."""
    k = p.find(key, start)
    if k < 0:
        return 0
    v = _value(p, k + len(key))
    if v < 0:
        return DECODE
    c = p[v]
    if c == 34:  # '"'
        return 0 if p[v + 1:v + 2] == b'"' else 1
    return 0 if p.startswith(b"null", v) else DECODE


def count_tokens(p: bytes) -> int:
    """Tokens the JSON path would count for this chunk, or DECODE. Reasoning and tool-call chunks are
    always DECODE: the JSON path labels them (`deltas.py`), so a count from here is an answer chunk; so
    are chunks with a server's `timings` (llama.cpp), which the JSON path records."""
    if (b'"reasoning' in p or b'"tool_calls"' in p or b'"timings"' in p
            or (b'"logprobs"' in p and b'"logprobs":null' not in p)):
        return DECODE
    # compact JSON (vLLM, SGLang, itlbench, OpenAI): a handful of C-level searches
    if (b'"finish_reason":null' in p and p.count(b'"finish_reason"') == 1 and b'"usage"' not in p
            and b'"error"' not in p):
        i = p.find(b'"token_ids":[')
        if i >= 0:
            if 48 <= p[i + 13] <= 57:  # a digit: a non-empty list of ids
                end = p.find(b"]", i + 13)
                return p.count(b",", i + 13, end) + 1 if end > 0 else DECODE
            if p[i + 13] != 93:  # not "[]" either
                return _count_general(p)
        elif b'"token_ids"' in p:
            return _count_general(p)
        i = p.find(b'"text":"')
        if i >= 0:
            return 0 if p[i + 8] == 34 else 1
        if b'"text"' not in p:
            i = p.find(b'"content":"')
            if i >= 0 and p[i + 11] != 34:
                return 1
    return _count_general(p)


def _count_general(p: bytes) -> int:
    """Any whitespace, token ids, null usage; DECODE for what only the JSON can tell."""
    if b'"error"' in p:
        return DECODE
    i = p.find(b'"finish_reason"')
    if i < 0 or p.find(b'"finish_reason"', i + 15) >= 0:  # no choice, or more than one
        return DECODE
    v = _value(p, i + 15)
    if v < 0 or not p.startswith(b"null", v):
        return DECODE
    i = p.find(b'"usage"')
    if i >= 0:
        v = _value(p, i + 7)
        if v < 0 or not p.startswith(b"null", v):
            return DECODE
    i = p.find(b'"token_ids"')
    if i >= 0:
        v = _value(p, i + 11)
        if v < 0:
            return DECODE
        if p[v] == 91:  # '['
            end = p.find(b"]", v)
            if end < 0:
                return DECODE
            if p[v + 1:end].strip(_WS):
                return p.count(b",", v, end) + 1
        elif not p.startswith(b"null", v):
            return DECODE
    if b'"text"' in p:
        i = p.find(b'"text"')
        v = _value(p, i + 6)
        if v < 0:
            return DECODE
        if p[v] == 34:
            return 0 if p[v + 1:v + 2] == b'"' else 1
        if not p.startswith(b"null", v):
            return DECODE
    i = p.find(b'"delta"')
    if i < 0:
        return DECODE
    return _string_state(p, b'"content"', i)


def json_count(obj: Any) -> tuple[int, bool]:
    """(tokens, plain) of a decoded chunk by the JSON path's rule; plain: nothing else to record
    (one choice, no finish, no usage, no error)."""
    if not isinstance(obj, dict):
        return 0, False
    choices = obj.get("choices")
    plain = ("error" not in obj and obj.get("object") != "error" and not obj.get("usage")
             and isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)
             and not choices[0].get("finish_reason"))
    if not choices or not isinstance(choices[0], dict):
        return 0, plain
    c = choices[0]
    ids = c.get("token_ids")
    if ids and isinstance(ids, list):
        return len(ids), plain
    return ((logprob_tokens(c) or 1) if choice_kind(c) else 0), plain


def _string_end(p: bytes, i: int) -> int:
    """Index of the quote closing the JSON string whose body starts at i; -1 if none."""
    while True:
        q = p.find(b'"', i)
        if q < 0:
            return -1
        k = q - 1
        while k >= i and p[k] == 92:  # count the backslashes before it
            k -= 1
        if (q - 1 - k) % 2 == 0:
            return q
        i = q + 1


class Shape:
    """A learnt content chunk: the bytes before its text value and from the value's closing quote on."""

    __slots__ = ("prefix", "suffix", "lp", "ls")

    def __init__(self, prefix: bytes, suffix: bytes) -> None:
        self.prefix, self.suffix = prefix, suffix
        self.lp, self.ls = len(prefix), len(suffix)

    @classmethod
    def learn(cls, p: bytes) -> Shape | None:
        """The shape of this chunk when it is plain and its one token is a text (or delta content) value."""
        for key in (b'"text":"', b'"content":"'):
            i = p.find(key)
            if i >= 0:
                break
        else:
            return None
        start = i + len(key)
        end = _string_end(p, start)
        if end <= start:
            return None
        prefix, suffix = p[:start], p[end:]
        if any(c in part for c in (b"\n", b"\r") for part in (prefix, suffix)):
            return None  # a multi-line event: not the one-line shape a whole-read check assumes
        try:  # the slot must be exactly the value the JSON path counts, and all else plain
            probe = _loads(prefix + b"a" + suffix)
            n, plain = json_count(probe)
        except ValueError:
            return None
        c = probe["choices"][0] if plain else {}
        delta = c.get("delta")
        slot = c.get("text") if key == b'"text":"' else delta.get("content") if isinstance(delta, dict) else None
        if not (plain and n == 1 and slot == "a"):
            return None
        return cls(prefix, suffix)

    def count(self, p: bytes) -> int:
        """1 for a chunk of this shape with a non-empty text, else DECODE (ask the slower paths)."""
        end = len(p) - self.ls
        if (end > self.lp and p.startswith(self.prefix) and p.endswith(self.suffix)
                and p.find(b'"', self.lp, end) < 0 and p[end - 1] != 92):
            return 1
        return DECODE
