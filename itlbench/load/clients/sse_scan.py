"""Token count of one streamed OpenAI chunk, and the learnt shape that counts a stream's content chunks by bytes.

`count_tokens` gives exactly what the JSON path in `sse` counts (`len(token_ids)` when non-empty, else 1 when
`text` or the delta's `content` is a non-empty string, else 0) for the chunks that carry nothing else the record
needs: one choice, `finish_reason` null, no `usage` object, no `error`. Anything else (a finish, usage, an error,
several choices, a shape it does not know, bytes that are not JSON) returns -1 and the caller decodes the JSON,
which records what is wrong with it. It parses with the JSON path's own loader: a scan of the bytes alone took
as long as the stdlib's parse (about 6 µs a chunk) and counted chunks the JSON path refuses (cut short, a key
without its colon), so a malformed reply passed through one reader and failed the other.

`Shape` is the fastest path: a stream's content chunks differ only in their text, so once one chunk
is learnt (decoded and checked), a later one that starts and ends with the same bytes and whose text in between
is a JSON string's body (`json_text`) is the same chunk with another text: 1 token, by two comparisons and a
few C-level checks of the text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from itlbench.load.clients.deltas import choice_kind, logprob_tokens

try:
    from orjson import loads as _loads
except ImportError:  # optional speed-up
    _loads = json.loads

DECODE = -1  # the scan cannot tell: decode the JSON
_UNPLAIN = re.compile(rb'["\\\x00-\x1f\x80-\xff]')  # a text with none of these is a JSON string's body as is
# ...and one with escapes or UTF-8 is where it matches this and decodes: the stdlib's loader and orjson read such a
# body alike; a surrogate's \u escape is left to the loader (the stdlib reads a lone one, orjson refuses it)
_JSON_TEXT = re.compile(rb'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*')


def count_tokens(p: bytes) -> int:
    """Tokens the JSON path would count for this chunk, or DECODE. Reasoning and tool-call chunks are
    always DECODE: the JSON path labels them (`deltas.py`), so a count from here is an answer chunk; so
    are chunks with a server's `timings` (llama.cpp), which the JSON path records."""
    if (b'"reasoning' in p or b'"tool_calls"' in p or b'"timings"' in p
            or (b'"logprobs"' in p and b'"logprobs":null' not in p)):
        return DECODE
    try:
        n, plain = json_count(_loads(p))
    except (ValueError, RecursionError):  # not JSON: the JSON path says so in the record
        return DECODE
    return n if plain else DECODE


def json_text(p: bytes, start: int, end: int) -> bool:
    """True when p[start:end], put between two quotes, is a JSON string the JSON path's loader takes. Plain
    ASCII is told by one search, escapes and UTF-8 by a match and a decode, a surrogate's escape by that loader."""
    if _UNPLAIN.search(p, start, end) is None:  # most texts: printable ASCII, no escape
        return True
    slot = p[start:end]
    if _JSON_TEXT.fullmatch(slot) is not None:
        try:
            slot.decode()
        except UnicodeDecodeError:
            return False
        return True
    if b"\\u" not in slot:
        return False
    try:
        return isinstance(_loads(b'"' + slot + b'"'), str)
    except (ValueError, RecursionError):
        return False


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
                and p.find(b'"', self.lp, end) < 0 and p[end - 1] != 92 and json_text(p, self.lp, end)):
            return 1
        return DECODE
