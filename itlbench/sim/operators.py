"""Kernel-by-kernel step time (profiles with cost_model "operators").

A decoder step runs, per layer, the QKV projection, attention, the output projection, an all-reduce
(tensor parallel), gate+up, the activation, down, another all-reduce, and the norms and residual adds;
then the LM head on the rows that sample. The kernels run one after another, so each meets its own
roof and the step is their sum, not one whole-step max(compute, memory):

- a weight GEMM of M rows: the larger of FLOPs / (peak · e(M)) and bytes / (bandwidth · mem_eff), or
  their roof_blend-norm (a kernel near the ridge overlaps loads and math imperfectly), + kernel_s, with
  e(M) = gemm_eff · M / (M + gemm_m_half): few-row products fill few tiles of the GPU and run far from
  peak (Vidur's A100 profiles: a 128-row QKV at ~45 % of peak where 8,192 rows reach ~70 %); past one
  tile (`Hardware.gemm_tile`, 128 rows of a 16-bit GEMM) the compute counts the rows rounded up to whole
  tiles, since a partial tile costs a whole one (Vidur's profiles: 8 rows past a multiple of 128 take
  1.15-1.19x the time at it), and on Hopper past 256 rows to whole 256-row clusters of two tiles;
- attention: compute over the causal query-key pairs at attn_eff (prefill), or the K/V read at
  attn_mem_eff of the bandwidth (decode), whichever is longer; mixed steps run one kernel over both.
  A profile with `attn_k_half` lowers the compute efficiency where each query reads few keys,
  attn_eff · k / (k + attn_k_half) with k the step's query-key pairs per row: a FlashAttention-style
  kernel's per-block setup is spread over fewer keys (NVIDIA's measured 2025 kernels run a 1k prompt
  at about 0.3 of peak and a 16k one at 0.6; benchmarks/aic_attention.py);
  Under GQA a kernel that gives each query head its own thread block reads a K/V head once per query
  head of its group, part of it from L2: `gqa_kv_reread` is the share of those repeated reads that
  reach HBM (0, the presets: one read per group, as FlashAttention-style kernels do; TensorRT-LLM
  v0.6's masked-MHA decode kernel: fitted, docs/perf/sim-vs-published.md);
- element-wise kernels (norms, RoPE, SiLU·mul, residual adds): their activation bytes at mem_eff;
- all-reduces: `CostModel.allreduce_s` of the step's rows, two per layer when tp > 1.

Every size is one GPU's shard under tensor parallelism (heads, intermediate width and vocabulary
split tp ways). Torch-free.
"""

from __future__ import annotations

from typing import Protocol

from itlbench.core.model_config import ModelConfig
from itlbench.sim.profile import Hardware
from itlbench.sim.shapes import StepShape, StepTime


class CostModel(Protocol):
    """What the operators read of roofline.CostModel (kept apart so the two do not import each other)."""

    model: ModelConfig
    tp: int
    b: float
    table_b: float
    act_bytes: float
    kv_heads_per_gpu: int
    kv_bytes_per_token_per_gpu: float

    def overhead_s(self, shape: StepShape, hw: Hardware) -> float: ...

    def allreduce_s(self, rows: int, hw: Hardware) -> float: ...

LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
ELEMENTWISE_KERNELS = 4  # fused add+norm twice, RoPE, SiLU·mul (vLLM's fused kernels)


def layer_gemm_shapes(cm: CostModel) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each layer GEMM on one GPU."""
    m, t = cm.model, cm.tp
    d, dh, f = m.hidden_size, m.head_dim, m.intermediate_size
    q = m.num_heads // t * dh
    kv = cm.kv_heads_per_gpu * dh
    return {"qkv": (d, q + 2 * kv), "o": (q, d), "gate_up": (d, 2 * f // t), "down": (f // t, d)}


def gemm_parts(cm: CostModel, rows: int, d_in: int, d_out: int, hw: Hardware,
               table: bool = False) -> tuple[float, float]:
    """(compute seconds, memory seconds) of one [rows, d_in] x [d_in, d_out] weight GEMM (`table`: the LM
    head, in the tables' dtype: 16-bit under fp8 and fp4)."""
    if rows <= 0:
        return 0.0, 0.0
    dtype = hw.table_dtype if table else hw.dtype
    computed = hw.gemm_rows_computed(rows)
    eff = hw.gemm_efficiency_of(dtype) * computed / (computed + hw.gemm_m_half) / hw.gemm_slowdown(rows)
    compute = 2.0 * computed * d_in * d_out / (hw.gemm_peak_of(dtype) * eff)
    moved = (cm.table_b if table else cm.b) * d_in * d_out + cm.act_bytes * rows * (d_in + d_out)
    return compute, moved / (hw.mem_bw * hw.mem_eff)


def gemm_seconds(cm: CostModel, name: str, rows: int, hw: Hardware) -> float:
    """One layer GEMM ('qkv', 'o', 'gate_up', 'down') of `rows` rows: what an operator profile records."""
    d_in, d_out = layer_gemm_shapes(cm)[name]
    return blend(*gemm_parts(cm, rows, d_in, d_out, hw), hw) + hw.kernel_s


def blend(compute: float, memory: float, hw: Hardware) -> float:
    """A kernel's time from its two roofs: the larger (roof_blend 0), or their `roof_blend`-norm, which
    charges a kernel near the ridge for overlapping its loads and its math imperfectly."""
    k = hw.roof_blend
    if k <= 0 or compute == 0 or memory == 0:
        return max(compute, memory)
    hi = max(compute, memory)
    return hi * ((compute / hi) ** k + (memory / hi) ** k) ** (1 / k)


def attention_parts(cm: CostModel, shape: StepShape, hw: Hardware) -> tuple[float, float]:
    """(compute, memory) seconds of one layer's attention over the step's chunks on one GPU."""
    m = cm.model
    flops = 4.0 * (m.num_heads // cm.tp) * m.head_dim * shape.attention_pairs
    kv_token_layer = cm.kv_bytes_per_token_per_gpu / m.num_layers
    group = max(1.0, (m.num_heads // cm.tp) / cm.kv_heads_per_gpu)  # query heads sharing one K/V head
    reads = 1.0 + (group - 1.0) * hw.gqa_kv_reread
    moved = kv_token_layer * reads * (shape.context_tokens + shape.tokens) + 2 * cm.act_bytes * shape.tokens * (
        m.num_heads // cm.tp * m.head_dim)
    return flops / (hw.peak_flops * attention_efficiency(shape, hw)), moved / (hw.mem_bw * (hw.attn_mem_eff or hw.mem_eff))


def attention_efficiency(shape: StepShape, hw: Hardware) -> float:
    """Prefill attention's share of peak: attn_eff, times k / (k + attn_k_half) where the profile has a length ramp
    (k: keys a row of the step reads, on average)."""
    if not hw.attn_k_half or not shape.tokens:
        return hw.attn_eff
    keys = max(1.0, shape.attention_pairs / shape.tokens)
    return hw.attn_eff * keys / (keys + hw.attn_k_half)


def elementwise_bytes(cm: CostModel, rows: int) -> float:
    """Activation bytes of one layer's element-wise kernels: two add+norms (read 2, write 2 rows of d),
    RoPE on q and k (read and write), SiLU·mul (read 2f/t, write f/t)."""
    m, t = cm.model, cm.tp
    d, f = m.hidden_size, m.intermediate_size
    q_k = (m.num_heads // t + cm.kv_heads_per_gpu) * m.head_dim
    return cm.act_bytes * rows * (2 * 4 * d + 2 * q_k + 3 * f // t)


def operator_time(cm: CostModel, shape: StepShape, hw: Hardware) -> StepTime:
    rows, layers = shape.tokens, cm.model.num_layers
    compute = memory = 0.0
    kernels = 0
    for d_in, d_out in layer_gemm_shapes(cm).values():
        c, mem = gemm_parts(cm, rows, d_in, d_out, hw)
        t = blend(c, mem, hw)
        compute, memory = (compute + t, memory) if c >= mem else (compute, memory + t)
        kernels += 1
    c, mem = attention_parts(cm, shape, hw)
    compute, memory = (compute + c, memory) if c >= mem else (compute, memory + mem)
    memory += elementwise_bytes(cm, rows) / (hw.mem_bw * hw.mem_eff)
    kernels += 1 + ELEMENTWISE_KERNELS
    compute, memory = compute * layers, memory * layers
    kernels *= layers
    if shape.sampled:
        c, mem = gemm_parts(cm, shape.sampled, cm.model.hidden_size, cm.model.vocab_size // cm.tp, hw, table=True)
        t = blend(c, mem, hw)
        compute, memory = (compute + t, memory) if c >= mem else (compute, memory + t)
        kernels += 1
    memory += cm.act_bytes * rows * cm.model.hidden_size / (hw.mem_bw * hw.mem_eff)  # embedding gather
    comm = 2 * layers * cm.allreduce_s(rows, hw)
    return StepTime(compute, memory, cm.overhead_s(shape, hw), comm, compute + memory + kernels * hw.kernel_s)
