"""Prompt synthesis to exact token counts.

Token-id mode gives exact lengths (the bundled engine and servers that accept token ids).
Text mode is for servers that only take text: it joins space-prefixed common words that common
BPE tokenizers encode as one token each, and `calibrate` corrects the words-per-token ratio once
the driver sees the server's `usage.prompt_tokens`.

Every unique part is drawn from a generator seeded by its request key, so it starts with
request-specific tokens and cannot share a cached prefix with another request by accident;
shared parts (documents, session history) are seeded by their key alone and reproduce exactly.

A `salt` (one per run by default) enters every part's seed, unique and shared alike: the next run
with the same `--seed` sends prompts of the same lengths at the same times, but with other tokens,
so a server's prefix cache left warm by an earlier run cannot serve them. Within one run, shared
documents still share their prefix. Without a salt the prompts of a seed are the same every run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from itlbench.errors import ConfigError

WORDS: tuple[str, ...] = tuple(
    " " + w for w in (
        "the of and to in is that for it as was with be by on not he this are or his from at "
        "which but have an had they you were their one all we can her has there been if more "
        "when will would who so no time people year way day man thing world life hand part "
        "place case week work number group point home water room book word money story fact "
        "month lot right study night house car city name team game line end member law idea "
        "body face door health art war history party result change morning reason research "
        "girl food moment air teacher force education state family school country problem "
        "question government company system program report market service power level order "
        "field area table river music voice light paper office model data value price road"
    ).split()
)
_CACHE_LIMIT = 256


@dataclass(frozen=True)
class Prompt:
    """A prompt of `tokens` tokens (exact in id mode, targeted in text mode)."""

    tokens: int
    ids: tuple[int, ...] | None = None
    text: str | None = None

    def __add__(self, other: Prompt) -> Prompt:
        ids = None if self.ids is None or other.ids is None else self.ids + other.ids
        text = None if self.text is None or other.text is None else self.text + other.text
        return Prompt(self.tokens + other.tokens, ids, text)

    def head(self, n: int) -> Prompt:
        """The first `n` tokens (text mode: the same share of words), an exact prefix."""
        if n >= self.tokens:
            return self
        ids = None if self.ids is None else self.ids[:n]
        text = None
        if self.text is not None:
            words = self.text.split(" ")[1:]
            keep = 0 if n <= 0 else max(1, round(len(words) * n / self.tokens))
            text = "".join(" " + w for w in words[:keep])
        return Prompt(max(0, n), ids, text)


def _key_seed(seed: int, namespace: str, key: str, salt: str | None = None) -> list[int]:
    text = f"{namespace}\0{key}" if salt is None else f"{namespace}\0{key}\0{salt}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return [seed & 0xFFFFFFFF, int.from_bytes(digest, "little")]


class PromptBuilder:
    """Builds deterministic prompts: `unique` per request, `shared` per document key; `salt` (per
    run) changes every prompt's tokens but none of their lengths."""

    def __init__(self, *, token_ids: bool = True, vocab_size: int = 32000,
                 reserved_ids: Iterable[int] = (), low: int = 10, seed: int = 0,
                 tokens_per_word: float = 1.0, salt: str | None = None) -> None:
        self.token_ids = token_ids
        self.seed = seed
        self.salt = salt
        self.tokens_per_word = _clamp_tokens_per_word(tokens_per_word)
        self._allowed = _allowed_ids(vocab_size, reserved_ids, low) if token_ids else None
        self._shared: dict[tuple[str, int], Prompt] = {}

    def unique(self, key: str, n: int) -> Prompt:
        """`n` tokens no other key produces; the same key always gives the same prompt."""
        return self._make("unique", key, n)

    def shared(self, key: str, n: int) -> Prompt:
        """`n` tokens determined by `key` alone, so every request using it shares the prefix."""
        cached = self._shared.get((key, n))
        if cached is None:
            cached = self._make("shared", key, n)
            if len(self._shared) < _CACHE_LIMIT:
                self._shared[(key, n)] = cached
        return cached

    def calibrate(self, ratio: float) -> None:
        """Text mode: the server counted `ratio` tokens per requested token; scale later text so
        its length converges on the request. Prompts already built keep their text."""
        if not ratio > 0:
            raise ValueError(f"calibration ratio must be > 0, got {ratio}")
        self.tokens_per_word = _clamp_tokens_per_word(self.tokens_per_word * ratio)

    def _make(self, namespace: str, key: str, n: int) -> Prompt:
        if n < 0:
            raise ValueError(f"prompt length must be >= 0, got {n}")
        rng = np.random.default_rng(_key_seed(self.seed, namespace, key, self.salt))
        if self._allowed is not None:
            picks = self._allowed[rng.integers(0, len(self._allowed), n)]
            return Prompt(n, ids=tuple(picks.tolist()))
        words = 0 if n == 0 else max(1, round(n / self.tokens_per_word))
        picks = rng.integers(0, len(WORDS), words)
        return Prompt(n, text="".join(WORDS[i] for i in picks))


def _clamp_tokens_per_word(value: float) -> float:
    """Common BPE tokenizers give ~1 token per listed word, a byte-level one ~5; beyond these bounds
    the server's count is not a tokenizer property but a template or an error."""
    if not value > 0:
        raise ValueError(f"tokens per word must be > 0, got {value}")
    return min(16.0, max(0.25, value))


def _allowed_ids(vocab_size: int, reserved_ids: Iterable[int], low: int) -> np.ndarray:
    """Ids in [low, vocab_size) minus reserved (special) ids."""
    allowed = np.setdiff1d(np.arange(low, vocab_size, dtype=np.int64),
                           np.fromiter(reserved_ids, dtype=np.int64))
    if len(allowed) == 0:
        raise ConfigError("--vocab-size", f"no usable token ids in [{low}, {vocab_size})",
                          "give the tokenizer's vocab size and only its special ids as reserved")
    return allowed
