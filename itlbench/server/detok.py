"""Incremental detokenization that never emits half a UTF-8 character.

Byte-level tokenizers split multi-byte characters across tokens; decoding each token alone would
stream replacement characters. Decoding a short window and holding back text that still ends in
U+FFFD keeps streamed text equal to the full decode at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class IncrementalDetokenizer:
    """Feed new token ids, get the newly completed text."""

    def __init__(self, tokenizer: _Decoder) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids already turned into emitted text

    def push(self, new_ids: Sequence[int], final: bool = False) -> str:
        self._ids.extend(new_ids)
        if not self._ids or self._read == len(self._ids):
            return ""
        window = self._tok.decode(self._ids[self._prefix:])
        if window.endswith(_REPLACEMENT) and not final:
            return ""
        emitted = self._tok.decode(self._ids[self._prefix:self._read])
        self._prefix, self._read = self._read, len(self._ids)
        return window[len(emitted):]
