"""A byte-level BPE tokenizer of any vocabulary size, trained on seeded synthetic text.

Exported model directories need a real `tokenizer.json` that the bundled engine, transformers and
vLLM all load, of exactly the model's vocabulary size, with BOS and EOS at the model's ids. Byte
level means every string encodes (no unknown token); the training text holds the load generator's
prompt words (`workloads.prompts.WORDS`), so each of them becomes one token and text-mode prompt
lengths come out as planned, plus seeded pseudo-words that fill the rest of the vocabulary.
Same vocabulary size and ids → the same file, byte for byte.
"""

from __future__ import annotations

import json

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from itlbench.errors import ConfigError
from itlbench.workloads.prompts import WORDS

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
_LETTERS = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
_ALPHABET = 256  # byte-level: one symbol per byte value


def _corpus(vocab_size: int, seed: int) -> list[str]:
    """Lines of text: the prompt words many times, then pseudo-words with Zipf-like letter frequencies."""
    rng = np.random.default_rng(seed)
    lines = ["".join(WORDS)] * 64
    weights = 1.0 / np.arange(1, len(_LETTERS) + 1)
    weights /= weights.sum()
    n_words = 24 * vocab_size
    lengths = np.minimum(rng.geometric(0.22, n_words) + 1, 14)
    letters = rng.choice(_LETTERS, size=int(lengths.sum()), p=weights)
    cuts = np.cumsum(lengths)[:-1]
    words = [" " + "".join(w) for w in np.split(letters, cuts)]
    lines.extend("".join(words[i:i + 64]) for i in range(0, n_words, 64))
    return lines


def build_tokenizer(vocab_size: int, bos_token_id: int, eos_token_id: int, seed: int = 0) -> Tokenizer:
    """Byte-level BPE with exactly `vocab_size` ids; BOS and EOS (and PAD at 0 when free) are special."""
    specials = {bos_token_id: BOS, eos_token_id: EOS}
    if 0 not in specials:
        specials[0] = PAD
    if bos_token_id == eos_token_id:
        raise ConfigError("model", f"bos_token_id and eos_token_id are both {bos_token_id}",
                          "a tokenizer needs distinct BOS and EOS ids")
    for tid in specials:
        if not 0 <= tid < vocab_size:
            raise ConfigError("model", f"special token id {tid} is outside the vocabulary",
                              f"give bos_token_id and eos_token_id below vocab_size={vocab_size}")
    regular = vocab_size - len(specials)
    if regular < _ALPHABET:
        raise ConfigError("model.vocab_size", f"{vocab_size} is too small for a byte-level tokenizer",
                          f"use at least {_ALPHABET + len(specials)}")
    trainer = trainers.BpeTrainer(vocab_size=regular, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    learner.train_from_iterator(_corpus(vocab_size, seed), trainer)
    trained = learner.get_vocab()
    if len(trained) != regular:
        raise ConfigError("model.vocab_size", f"the training text yields {len(trained)} tokens, not {regular}",
                          "use a smaller vocabulary")
    # Regular tokens keep their trained order and fill the ids the special tokens leave free.
    free = (i for i in range(vocab_size) if i not in specials)
    vocab = {tok: next(free) for tok, _ in sorted(trained.items(), key=lambda kv: kv[1])}
    vocab.update({text: tid for tid, text in specials.items()})
    merges = _merges(learner)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(specials[tid], special=True, normalized=False)
                            for tid in sorted(specials)])
    return tok


def _merges(learner: Tokenizer) -> list[tuple[str, str]]:
    model = json.loads(learner.to_str())["model"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
