"""Tokenizers: a model directory's `tokenizer.json`, or a byte-level fallback for presets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from itlbench.core.model_config import ModelConfig
from itlbench.errors import ConfigError

NUM_SPECIAL = 3  # ids 0 pad, 1 bos, 2 eos are never produced by bytes
_PRINTABLE = 95  # ' ' .. '~'


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 3), so prompt lengths are exact and predictable.

    Ids above the byte range (a random model emits them) decode to a printable ASCII character so
    streamed text stays readable; special ids decode to nothing.
    """

    def __init__(self, vocab_size: int, bos_token_id: int = 1, eos_token_id: int = 2) -> None:
        if vocab_size <= NUM_SPECIAL:
            raise ConfigError("model.vocab_size", f"byte tokenizer needs more than {NUM_SPECIAL} ids, got {vocab_size}",
                              f"set vocab_size to at least {NUM_SPECIAL + 256}, an id per byte, in the model's config.json")
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self._num_byte_ids = min(256, vocab_size - NUM_SPECIAL)

    def encode(self, text: str) -> list[int]:
        n = self._num_byte_ids
        return [NUM_SPECIAL + b % n for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        out = bytearray()
        for i in ids:
            if i < NUM_SPECIAL or i in (self.bos_token_id, self.eos_token_id):
                continue
            b = i - NUM_SPECIAL
            out.append(b if b < self._num_byte_ids else 32 + b % _PRINTABLE)
        return out.decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` library (no transformers needed)."""

    def __init__(self, path: Path, bos_token_id: int, eos_token_id: int) -> None:
        from tokenizers import Tokenizer as _Tok

        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exception subclasses
            raise ConfigError("model", f"cannot read {path}: {exc}", "provide a valid tokenizer.json") from exc
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(model_config: ModelConfig) -> Tokenizer:
    """The model directory's tokenizer.json when there is one, else the byte fallback."""
    if model_config.path:
        file = Path(model_config.path) / "tokenizer.json"
        if file.is_file():
            tok = HFTokenizer(file, model_config.bos_token_id, model_config.eos_token_id)
            if tok.vocab_size > model_config.vocab_size:
                raise ConfigError("model", f"tokenizer has {tok.vocab_size} ids but model.vocab_size is "
                                  f"{model_config.vocab_size}", "use the tokenizer that ships with the weights")
            return tok
    return ByteTokenizer(model_config.vocab_size, model_config.bos_token_id, model_config.eos_token_id)
