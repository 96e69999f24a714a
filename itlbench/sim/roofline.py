"""Roofline cost model of one engine step: FLOPs, bytes, and time on a given accelerator.

A step is summarised by four token counts (`StepShape`) that the scheduler's chunks determine:
rows computed, rows that sample (go through the LM head), cached context tokens read, and causal
query-key pairs attended. Every cost term is linear in them:

- weight GEMMs: 2 FLOPs per weight per row (the source documents' "2P per token");
- attention: QKᵀ and PV cost 4 · L · h · d_h FLOPs per query-key pair; a chunk of n rows after a
  prefix of p cached tokens attends n·p + n(n+1)/2 pairs (quadratic in prefill, linear in decode);
- bytes: the weights once per step, the K/V of every cached context token read, the new rows' K/V
  written (activations are ignored, as in the source documents' whole-model arithmetic).

Step time = max(compute / (peak × efficiency), bytes / (bandwidth × efficiency)) + a fixed
per-step overhead (plus one per scheduled sequence), with separate efficiencies for GEMMs and
attention.

Two counting conventions: "textbook" is the source documents' (2P per row with P including both embedding
tables, the LM head applied to every row); "executed" is what the bundled engine runs (embedding
rows gathered, not multiplied; the LM head only on rows that sample). Calibrated profiles use
"executed"; the GPU presets use "textbook" so the source documents' figures come out of them unchanged.
Torch-free on purpose: the simulator and the CLI import it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from itlbench.core.model_config import ModelConfig
from itlbench.errors import ConfigError

Counting = Literal["textbook", "executed"]
COUNTINGS: tuple[str, ...] = ("textbook", "executed")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---------------------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Hardware:
    """An accelerator's roofs, the efficiencies a real engine reaches on them, and a per-step cost.

    `peak_flops` is the dense rate for `dtype` (no sparsity); `mem_bw` the memory bandwidth in
    bytes/s; `memory_bytes` what holds weights and the KV cache.
    """

    name: str
    label: str
    peak_flops: float
    mem_bw: float
    memory_bytes: float
    dtype: str = "bfloat16"
    gemm_eff: float = 0.40
    attn_eff: float = 0.40
    mem_eff: float = 0.80
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0  # per sequence (chunk) in the step: per-request launches, gathers, sampling
    counting: Counting = "textbook"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "mem_bw", "memory_bytes", "gemm_eff", "attn_eff", "mem_eff"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"gpu.{name}", f"must be a positive number, got {value!r}")
        for name in ("step_overhead_s", "seq_overhead_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"gpu.{name}", f"must be >= 0, got {getattr(self, name)}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError("gpu.dtype", f"unknown dtype {self.dtype!r}", f"use one of {', '.join(DTYPE_BYTES)}")
        if self.counting not in COUNTINGS:
            raise ConfigError("gpu.counting", f"unknown counting {self.counting!r}", "use textbook or executed")

    @property
    def ridge(self) -> float:
        """FLOP per byte where the compute and bandwidth roofs meet (π / β)."""
        return self.peak_flops / self.mem_bw

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def with_(self, **changes: object) -> Hardware:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, object], origin: str = "profile") -> Hardware:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError("--gpu", f"{origin} has unknown keys {', '.join(unknown)}",
                              f"a hardware profile holds {', '.join(sorted(known))}")
        missing = [k for k in ("name", "peak_flops", "mem_bw", "memory_bytes") if k not in raw]
        if missing:
            raise ConfigError("--gpu", f"{origin} lacks {', '.join(missing)}")
        raw = dict(raw)
        raw.setdefault("label", raw["name"])
        return cls(**raw)  # type: ignore[arg-type]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# Vendor datasheet figures: dense (non-sparse) BF16 tensor-core rate, memory bandwidth, capacity.
# Efficiencies are the source documents' illustrative ones (40 % of peak in compute, 80 % of bandwidth): they
# give their 2.04 s for a 32k prefill and 9.2 ms for a batch-32 decode step of Llama-3-8B on an H100.
# `itlbench calibrate` replaces them with fitted ones.
_SOURCE_EFF = "efficiencies: the source documents' illustrative 40 % of peak compute, 80 % of bandwidth"
GPUS: dict[str, Hardware] = {
    "h100": Hardware(
        "h100", "H100 SXM", 989e12, 3.35e12, 80e9,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity "
               "(989 dense), 3.35 TB/s HBM3, 80 GB; " + _SOURCE_EFF),
    "h200": Hardware(
        "h200", "H200 SXM", 989e12, 4.8e12, 141e9,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity "
               "(989 dense), 4.8 TB/s HBM3e, 141 GB; " + _SOURCE_EFF),
    "a100": Hardware(
        "a100", "A100 80GB SXM", 312e12, 2.039e12, 80e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS dense "
               "(624 with sparsity), 2,039 GB/s HBM2e, 80 GB; " + _SOURCE_EFF),
    "l40s": Hardware(
        "l40s", "L40S", 362.05e12, 864e9, 48e9,
        source="NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity), "
               "864 GB/s GDDR6, 48 GB; " + _SOURCE_EFF),
    "rtx4090": Hardware(
        "rtx4090", "RTX 4090", 165.2e12, 1.008e12, 24e9,
        source="NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090): BF16 tensor with FP32 "
               "accumulate 165.2 TFLOPS dense (330.4 with sparsity), 1,008 GB/s GDDR6X, 24 GB; " + _SOURCE_EFF),
}
_ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-80g": "a100",
            "4090": "rtx4090", "rtx-4090": "rtx4090"}
GPU_CHOICES = (*GPUS, "cpu")


def measure_cpu(seconds: float = 1.0) -> Hardware:
    """'This CPU': its measured read bandwidth and fp32 matmul rate as the roofs, efficiency 1.

    Measured, not specified, so the roofs are what this machine reaches, not what it could.
    Uses torch when installed (the engine's own kernels), numpy otherwise.
    """
    import os

    import numpy as np
    import psutil

    try:
        import torch

        def matmul_rate(n: int) -> float:
            a, b = torch.randn(n, n), torch.randn(n, n)
            return _best_rate(lambda: a @ b, 2.0 * n**3, seconds / 4)

        def read_bw(n_bytes: int) -> float:
            x = torch.ones(n_bytes // 4)
            return _best_rate(x.sum, float(x.nbytes), seconds / 4)
    except ImportError:
        def matmul_rate(n: int) -> float:
            a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
            return _best_rate(lambda: a @ b, 2.0 * n**3, seconds / 4)

        def read_bw(n_bytes: int) -> float:
            x = np.ones(n_bytes // 4, np.float32)
            return _best_rate(x.sum, float(x.nbytes), seconds / 4)

    flops = max(matmul_rate(512), matmul_rate(1024))
    bw = read_bw(512 << 20)
    return Hardware("cpu", f"this CPU ({os.cpu_count()} cores, measured)", flops, bw,
                    float(psutil.virtual_memory().total), dtype="float32", gemm_eff=1.0, attn_eff=1.0,
                    mem_eff=1.0, counting="executed",
                    source="measured: best fp32 matmul rate (n = 512, 1024) and best read bandwidth (512 MiB sum)")


def _best_rate(fn: object, work: float, budget_s: float) -> float:
    best = math.inf
    deadline = time.perf_counter() + budget_s
    for i in range(50):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return work / best


def load_hardware(spec: str) -> Hardware:
    """A preset name (h100, h200, a100, l40s, rtx4090), 'cpu' (measured now), or a profile JSON path."""
    key = spec.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    if key == "cpu":
        return measure_cpu()
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError("--gpu", f"{path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--gpu", f"{path} does not hold a JSON object")
        return Hardware.from_dict(raw, str(path))
    raise ConfigError("--gpu", f"unknown GPU or profile {spec!r}",
                      f"use one of {', '.join(GPU_CHOICES)} or a profile written by `itlbench calibrate`")


# ---------------------------------------------------------------------------------------- step shape


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
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


# ---------------------------------------------------------------------------------------- model costs


@dataclass(frozen=True)
class Gemm:
    """One weight matrix multiply: [T, d_in] × [d_in, d_out]."""

    name: str
    d_in: int
    d_out: int

    def intensity(self, tokens: int, dtype_bytes: int) -> float:
        """FLOPs / (weights + input + output activations) bytes."""
        flops = 2.0 * tokens * self.d_in * self.d_out
        bytes_ = dtype_bytes * (self.d_in * self.d_out + tokens * self.d_in + tokens * self.d_out)
        return flops / bytes_

    def ridge_tokens(self, ridge: float, dtype_bytes: int) -> float:
        """Token rows at which this GEMM's intensity reaches `ridge` (inf: never)."""
        denom = 2.0 * self.d_in * self.d_out - ridge * dtype_bytes * (self.d_in + self.d_out)
        return ridge * dtype_bytes * self.d_in * self.d_out / denom if denom > 0 else math.inf


class CostModel:
    """Costs of steps of one model in one dtype under one counting convention."""

    def __init__(self, model: ModelConfig, dtype_bytes: int = 2, counting: Counting = "textbook") -> None:
        if counting not in COUNTINGS:
            raise ConfigError("counting", f"unknown counting {counting!r}", "use textbook or executed")
        self.model, self.b, self.counting = model, dtype_bytes, counting
        m = model
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        self.layer_linear_params = m.num_layers * (m.hidden_size * (q + 2 * kv) + q * m.hidden_size
                                                   + 3 * m.hidden_size * m.intermediate_size)
        self.norm_params = (2 * m.num_layers + 1) * m.hidden_size
        self.table_params = m.vocab_size * m.hidden_size  # one embedding table (or LM head)
        self.params = m.num_params
        self.kv_bytes_per_token = m.kv_bytes_per_token(dtype_bytes)
        self.attn_flops_per_pair = 4 * m.num_layers * m.num_heads * m.head_dim

    @classmethod
    def for_hardware(cls, model: ModelConfig, hw: Hardware) -> CostModel:
        return cls(model, hw.dtype_bytes, hw.counting)

    @property
    def weight_bytes(self) -> int:
        """All parameters in the serving dtype (what an ITL floor must stream per step)."""
        return self.params * self.b

    def gemms(self) -> list[Gemm]:
        """The weight GEMMs of one layer, then the LM head."""
        m = self.model
        d, q, kv, f = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.intermediate_size
        return [Gemm("q_proj", d, q), Gemm("k_proj", d, kv), Gemm("v_proj", d, kv), Gemm("o_proj", q, d),
                Gemm("gate_proj", d, f), Gemm("up_proj", d, f), Gemm("down_proj", f, d),
                Gemm("lm_head", d, m.vocab_size)]

    def cost(self, shape: StepShape) -> StepCost:
        attn = float(self.attn_flops_per_pair) * shape.attention_pairs
        kv_read = float(self.kv_bytes_per_token) * shape.context_tokens
        kv_write = float(self.kv_bytes_per_token) * shape.tokens
        if shape.tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        if self.counting == "textbook":
            return StepCost(2.0 * self.params * shape.tokens, attn, float(self.params * self.b), kv_read, kv_write)
        gemm = 2.0 * (self.layer_linear_params * shape.tokens + self.table_params * shape.sampled)
        weights = self.layer_linear_params + self.norm_params + (self.table_params if shape.sampled else 0)
        gathered = shape.tokens * self.model.hidden_size  # embedding rows looked up
        return StepCost(gemm, attn, float((weights + gathered) * self.b), kv_read, kv_write)

    def time(self, shape: StepShape, hw: Hardware) -> StepTime:
        c = self.cost(shape)
        if shape.tokens == 0:
            return StepTime(0.0, 0.0, 0.0)
        compute = c.gemm_flops / (hw.peak_flops * hw.gemm_eff) + c.attn_flops / (hw.peak_flops * hw.attn_eff)
        memory = c.bytes / (hw.mem_bw * hw.mem_eff)
        return StepTime(compute, memory, hw.step_overhead_s + hw.seq_overhead_s * shape.sequences)

    def crossover_tokens(self, ridge: float) -> float:
        """Prompt length at which a whole-prompt prefill's intensity reaches `ridge`: below it the
        prefill is bandwidth-bound like decode, above it compute-bound."""
        lo, hi = 1, 1
        while self.cost(StepShape.prefill(hi)).intensity < ridge:
            hi *= 2
            if hi > 1 << 40:
                return math.inf
        if self.cost(StepShape.prefill(lo)).intensity >= ridge:
            return 1.0
        for _ in range(80):  # bisection on a real-valued length via linear interpolation of integers
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            if self.cost(StepShape.prefill(mid)).intensity < ridge:
                lo = mid
            else:
                hi = mid
        i_lo, i_hi = self.cost(StepShape.prefill(lo)).intensity, self.cost(StepShape.prefill(hi)).intensity
        return lo + (ridge - i_lo) / (i_hi - i_lo) if i_hi > i_lo else float(hi)

    def kv_capacity_tokens(self, hw: Hardware, utilization: float = 0.9) -> int:
        """Tokens of K/V that fit beside the weights in `utilization` of the device memory."""
        free = hw.memory_bytes * utilization - self.weight_bytes
        return max(0, int(free // self.kv_bytes_per_token))
