"""What decides a step's cost (its token counts) and what it costs (FLOPs, bytes, time in parts):
the shapes both the roofline arithmetic and the operator-by-operator model work in."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepShape:
    """The token counts that decide a step's cost (sums over the step's chunks)."""

    tokens: int  # rows computed (new tokens)
    sampled: int  # rows that go through the LM head
    context_tokens: int  # cached tokens whose K/V the rows read (Σ prefix)
    attention_pairs: int  # causal query-key pairs (Σ n·p + n(n+1)/2)
    sequences: int = 0  # chunks (one per scheduled request)

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int, bool]]) -> StepShape:
        """From (new tokens, prefix tokens, samples) per chunk."""
        tokens = sampled = context = pairs = sequences = 0
        for n, p, samples in chunks:
            tokens += n
            sampled += bool(samples)
            context += p
            pairs += n * p + n * (n + 1) // 2
            sequences += 1
        return cls(tokens, sampled, context, pairs, sequences)

    @classmethod
    def prefill(cls, prompt: int, prefix: int = 0) -> StepShape:
        return cls.of([(prompt, prefix, True)])

    @classmethod
    def decode(cls, batch: int, context: int) -> StepShape:
        """`batch` sequences each generating one token after `context` cached tokens."""
        return cls.of([(1, context, True)] * batch)

    @classmethod
    def split(cls, step: Mapping[str, Any]) -> tuple[StepShape, StepShape]:
        """(prefill part, decode part) of a step record (a StepRecord's dict or a steps-table row):
        each decode row is one sampled token after its context, the prefill part is the rest."""
        d_rows, d_ctx = int(step["decode_tokens"]), int(step.get("decode_context_tokens") or 0)
        decode = cls(d_rows, d_rows, d_ctx, d_ctx + d_rows, d_rows)
        total = cls(int(step["prefill_tokens"]) + d_rows, int(step.get("num_sampled") or 0),
                    int(step.get("context_tokens") or 0), int(step.get("attention_pairs") or 0),
                    int(step["num_prefill_reqs"]) + int(step["num_decode_reqs"]))
        prefill = cls(total.tokens - d_rows, max(0, total.sampled - d_rows), total.context_tokens - d_ctx,
                      max(0, total.attention_pairs - decode.attention_pairs), total.sequences - d_rows)
        return prefill, decode

    def __add__(self, other: StepShape) -> StepShape:
        return StepShape(self.tokens + other.tokens, self.sampled + other.sampled,
                         self.context_tokens + other.context_tokens, self.attention_pairs + other.attention_pairs,
                         self.sequences + other.sequences)


@dataclass(frozen=True)
class StepCost:
    gemm_flops: float
    attn_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attn_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.bytes if self.bytes else math.inf


@dataclass(frozen=True)
class StepTime:
    """A step's time in parts. Roofline profiles: max(compute, memory) + comm + overhead. Operator
    profiles: `kernels_s` (each kernel at its own roof, run one after another) + comm + overhead, with
    compute_s / memory_s the kernel time spent compute- and bandwidth-bound."""

    compute_s: float
    memory_s: float
    overhead_s: float
    comm_s: float = 0.0
    kernels_s: float | None = None

    @property
    def total_s(self) -> float:
        body = max(self.compute_s, self.memory_s) if self.kernels_s is None else self.kernels_s
        return body + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


# ---------------------------------------------------------------------------------------- model costs
