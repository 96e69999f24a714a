"""OpenAI `stop` strings, matched in the HTTP front end as vLLM's V1 output processor does.

The match is done here, on the text the client would see, not in the engine: the engine then steps as it
does without stop strings (no detokenizing on the engine thread, whose step times are what itlbench
measures), and the front end ends the request (`RequestStream.abort("stop", n)`) when a stop string shows
up, which frees its KV blocks and records a "stop" finish.

`StopStringMatcher` is the text part. The response ends at the first point where the text completes any
stop string (the earliest end; of stop strings ending there, the longest), just before it, or just after
it with `include_stop_str_in_output`. Text that may be the start of a stop string is held back until the
next text decides it, and only that much: the longest tail of the text that is a proper prefix of a stop
string (vLLM holds back a fixed len(longest stop) - 1 characters). Emitted text is never taken back, so
the concatenated pieces are the same for every split of the same text: streamed equals non-streamed.

`StopStrings` feeds it token by token through the incremental detokenizer (whole UTF-8 characters only)
and says which token completed the match: the response keeps the tokens up to and including it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from itlbench.server.detok import IncrementalDetokenizer, _Decoder
from itlbench.serving.client import RequestStream


class StopStringMatcher:
    """Push text as it is generated; get back the text that can be shown. After a match `matched` is the
    stop string and no more text comes; at the end without one, `flush()` gives the text held back."""

    def __init__(self, stops: Sequence[str], include_in_output: bool = False) -> None:
        if not stops or not all(stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = tuple(dict.fromkeys(stops))
        self.include = include_in_output
        self._longest = max(map(len, self.stops))
        self._firsts = frozenset(s[0] for s in self.stops)
        self.matched: str | None = None
        self._buf = ""  # the text a stop string may still start in: a proper prefix of one, or ""
        self._shown = 0  # how much of _buf was emitted already (all of it when include, none otherwise)

    def push(self, text: str, check: bool = True) -> str:
        """The newly showable text. `check=False` (vLLM's min_tokens): `text` is shown and no stop string
        is looked for in it, nor in one that begins in it."""
        if self.matched is not None or not text:
            return ""
        if not check:
            out = self._buf[self._shown:] + text
            self._buf, self._shown = "", 0
            return out
        buf = self._buf + text
        hit = self._first_match(buf, len(self._buf))
        if hit is not None:
            start, stop = hit
            self.matched = stop
            end = start + len(stop) if self.include else start
            out = buf[self._shown:end]
            self._buf, self._shown = "", 0
            return out
        keep = self._undecided(buf)
        out = buf[self._shown:] if self.include else buf[:keep]
        self._buf = buf[keep:]
        self._shown = len(self._buf) if self.include else 0
        return out

    def flush(self) -> str:
        """The text held back, once no more text will come."""
        out = "" if self.matched is not None else self._buf[self._shown:]
        self._buf, self._shown = "", 0
        return out

    def _first_match(self, buf: str, old: int) -> tuple[int, str] | None:
        """(start, stop) of the match ending first in `buf`, the longest of those ending there; `buf[:old]`
        holds none, so only matches ending after it are looked for."""
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stops:
            start = buf.find(stop, max(0, old - len(stop) + 1))
            if start >= 0:
                cand = (start + len(stop), start, stop)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        return None if best is None else (best[1], best[2])

    def _undecided(self, buf: str) -> int:
        """Where the longest tail of `buf` that is a proper prefix of a stop string begins (len(buf): none).
        Called only on text holding no whole stop string. `buf` starts where the last call's tail began and
        a tail that was no prefix stays none, so each character is ruled out once: linear in the text."""
        firsts = self._firsts
        for i in range(max(0, len(buf) - self._longest + 1), len(buf)):
            if buf[i] in firsts:
                tail = buf[i:]
                if any(s.startswith(tail) for s in self.stops):
                    return i
        return len(buf)


@dataclass(frozen=True, slots=True)
class Fed:
    """What one engine output adds to a response: its text, how many of its tokens count, the stop string
    that ended the response (None while none has)."""

    text: str
    num_tokens: int
    matched: str | None = None


class StopStrings:
    """Token ids in, the response's text and cut out: the incremental detokenizer and a matcher, with no
    stop string looked for in the text of the first `min_tokens` tokens (as vLLM)."""

    def __init__(self, tokenizer: _Decoder, stops: Sequence[str], include_in_output: bool, min_tokens: int = 0) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(stops, include_in_output)
        self.min_tokens = min_tokens
        self.num_tokens = 0  # tokens fed so far

    @property
    def matched(self) -> str | None:
        """The stop string that ended the response (then `num_tokens` is the tokens it keeps), or None."""
        return self.matcher.matched

    def feed(self, ids: Sequence[int], final: bool = False) -> Fed:
        """The text of `ids` (the tokens whose text is shown), one token at a time so the count is exact.
        `final`: the engine finished the request; held-back text is flushed. Nothing, after a match."""
        if self.matcher.matched is not None:
            return Fed("", 0)
        parts: list[str] = []
        for i, tok in enumerate(ids):
            self.num_tokens += 1
            last = final and i == len(ids) - 1
            text = self.detok.push((tok,), final=last)
            parts.append(self.matcher.push(text, check=self.num_tokens > self.min_tokens))
            if self.matcher.matched is not None:
                return Fed("".join(parts), i + 1, self.matcher.matched)
        if final:
            if not ids:
                parts.append(self.matcher.push(self.detok.push((), final=True),
                                               check=self.num_tokens > self.min_tokens))
                if self.matcher.matched is not None:
                    return Fed("".join(parts), 0, self.matcher.matched)
            parts.append(self.matcher.flush())
        return Fed("".join(parts), len(ids))


def cut_at_stop(stops: StopStrings, stream: RequestStream, done: int, shown: list[int], ids: list[int],
                reason: str | None, stop_reason: int | None) -> tuple[str, list[int], str | None, int | str | None]:
    """One engine output through the stop strings: (text, ids kept, finish_reason, stop_reason). A match
    keeps the ids up to the one that completed it, and ends the engine's request as a "stop" finish after
    `done` + those (the engine may have run a step further meanwhile, as vLLM's does)."""
    fed = stops.feed(shown, final=reason is not None)
    if fed.matched is None:
        return fed.text, ids, reason, stop_reason
    ids = ids[:fed.num_tokens]
    stream.abort("stop", done + len(ids))
    return fed.text, ids, "stop", fed.matched
