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
rows gathered, not multiplied; the LM head only on rows that sample). Calibrated profiles and the
GPU presets use "executed"; the `-seeds` profiles use "textbook" so the source documents' figures come
out of them unchanged. Profiles with cost_model "operators" are timed kernel by kernel (sim/operators.py).
Tensor parallelism divides the costs by `tp` and adds two all-reduces per layer (`CostModel`).
Torch-free on purpose: the simulator and the CLI import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from itlbench.core.model_config import ModelConfig
from itlbench.errors import ConfigError
from itlbench.sim.allreduce_tables import interpolate
from itlbench.sim.hardware import (  # noqa: F401  (re-exported: the simulator's public names)
    COUNTINGS,
    DTYPE_BYTES,
    GPU_CHOICES,
    GPUS,
    SEEDS,
    Counting,
    Hardware,
    load_hardware,
    measure_cpu,
    seeds_profile,
)
from itlbench.sim.operators import operator_time
from itlbench.sim.shapes import StepCost, StepShape, StepTime  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Gemm:
    """One weight matrix multiply: [T, d_in] × [d_in, d_out]."""

    name: str
    d_in: int
    d_out: int

    def intensity(self, tokens: int, dtype_bytes: float) -> float:
        """FLOPs / (weights + input + output activations) bytes."""
        flops = 2.0 * tokens * self.d_in * self.d_out
        bytes_ = dtype_bytes * (self.d_in * self.d_out + tokens * self.d_in + tokens * self.d_out)
        return flops / bytes_

    def ridge_tokens(self, ridge: float, dtype_bytes: float) -> float:
        """Token rows at which this GEMM's intensity reaches `ridge` (inf: never)."""
        denom = 2.0 * self.d_in * self.d_out - ridge * dtype_bytes * (self.d_in + self.d_out)
        return ridge * dtype_bytes * self.d_in * self.d_out / denom if denom > 0 else math.inf


class CostModel:
    """Costs of steps of one model in one dtype under one counting convention, on `tp` GPUs.

    Tensor parallelism (Megatron-style) splits every weight GEMM, the attention heads, the K/V and the
    LM head `tp` ways; each layer adds two all-reduces of the step's activations (after the attention
    output projection and after the MLP). Costs (`cost`) are per GPU; the K/V room is per GPU memory.
    Pipeline parallelism is not modelled: it changes the schedule (micro-batches in flight, bubbles),
    not one step's cost, so it does not fall out of a per-step model.
    """

    def __init__(self, model: ModelConfig, dtype_bytes: float = 2, counting: Counting = "textbook", tp: int = 1,
                 cuda_graphs: bool = True, kv_dtype_bytes: int | None = None,
                 table_dtype_bytes: float | None = None) -> None:
        if counting not in COUNTINGS:
            raise ConfigError("counting", f"unknown counting {counting!r}", "use textbook or executed")
        if not (isinstance(tp, int) and tp >= 1):
            raise ConfigError("tp", f"must be a whole number >= 1, got {tp!r}", "e.g. --tp 2")
        if model.num_heads % tp:
            raise ConfigError("tp", f"{tp} does not divide {model.name}'s {model.num_heads} attention heads",
                              "use a tensor-parallel degree that divides the head count (1, 2, 4, 8, ...)")
        if model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise ConfigError("tp", f"{tp} and {model.name}'s {model.num_kv_heads} K/V heads do not divide each "
                              "other", "use a degree that divides the K/V heads or is a multiple of them")
        self.model, self.b, self.counting, self.tp, self.cuda_graphs = model, dtype_bytes, counting, tp, cuda_graphs
        m = model
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        self.layer_linear_params = m.num_layers * (m.hidden_size * (q + 2 * kv) + q * m.hidden_size
                                                   + 3 * m.hidden_size * m.intermediate_size)
        # the norms (and Qwen2's q/k/v biases, Qwen3's q/k norms: a few thousand per layer), whole on each GPU
        self.norm_params = m.vector_params
        self.table_params = m.vocab_size * m.hidden_size  # one embedding table (or LM head)
        self.params = m.num_params
        # the embedding and LM head in the weights' dtype unless told otherwise (FP8 and NVFP4 checkpoints keep them 16-bit)
        self.table_b = table_dtype_bytes or dtype_bytes
        # K/V in the weights' dtype unless told otherwise (an FP8 checkpoint may keep a 16-bit cache)
        self.kv_b = kv_dtype_bytes or dtype_bytes
        self.kv_bytes_per_token = m.kv_bytes_per_token(self.kv_b)
        # K/V heads per GPU: split when tp divides them, replicated when there are fewer heads than GPUs
        self.kv_heads_per_gpu = max(1, m.num_kv_heads // tp)
        self.kv_bytes_per_token_per_gpu = self.kv_bytes_per_token * self.kv_heads_per_gpu // m.num_kv_heads
        self.attn_flops_per_pair = 4 * m.num_layers * m.num_heads * m.head_dim
        self.act_bytes = 4 if dtype_bytes == 4 else 2  # activations stay 16-bit under fp8 weights

    @classmethod
    def for_hardware(cls, model: ModelConfig, hw: Hardware, tp: int = 1, cuda_graphs: bool = True,
                     kv_dtype_bytes: int | None = None) -> CostModel:
        """`hw`'s dtype for the weights; its tables' dtype for the embedding and LM head; `kv_dtype_bytes` for
        the K/V, or the dtype's default (the weights', FP8 under fp4). A degree past the GPUs one link joins is
        refused: its all-reduces would cross servers, over links no profile prices."""
        if tp > hw.link_domain and hw.link_bw > 0:
            raise ConfigError("tp", f"{tp} GPUs exceed {hw.the_label}'s {hw.interconnect} domain of {hw.link_domain}",
                              f"use --tp {hw.link_domain} or less: all-reduces between servers (InfiniBand, Ethernet) "
                              "are not modelled; a profile JSON whose link joins more GPUs sets link_domain")
        return cls(model, hw.dtype_bytes, hw.counting, tp, cuda_graphs, kv_dtype_bytes or hw.default_kv_bytes,
                   DTYPE_BYTES[hw.table_dtype])

    @property
    def weight_bytes_per_gpu(self) -> float:
        """What one GPU holds: its shard of the layers and of both tables, the norms whole."""
        tables = self.params - self.layer_linear_params - self.norm_params
        return self.layer_linear_params / self.tp * self.b + (tables / self.tp + self.norm_params) * self.table_b

    @property
    def weight_bytes(self) -> float:
        """All parameters: the layers in the serving dtype, the tables and norms in theirs (what an ITL floor must
        stream per step)."""
        return self.layer_linear_params * self.b + (self.params - self.layer_linear_params) * self.table_b

    def gemms(self) -> list[Gemm]:
        """The weight GEMMs of one layer, then the LM head."""
        m = self.model
        d, q, kv, f = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.intermediate_size
        return [Gemm("q_proj", d, q), Gemm("k_proj", d, kv), Gemm("v_proj", d, kv), Gemm("o_proj", q, d),
                Gemm("gate_proj", d, f), Gemm("up_proj", d, f), Gemm("down_proj", f, d),
                Gemm("lm_head", d, m.vocab_size)]

    def cost(self, shape: StepShape) -> StepCost:
        """FLOPs and bytes of one GPU's share of the step (the whole step at tp = 1)."""
        t = self.tp
        attn = float(self.attn_flops_per_pair) * shape.attention_pairs / t
        kv_read = float(self.kv_bytes_per_token_per_gpu) * shape.context_tokens
        kv_write = float(self.kv_bytes_per_token_per_gpu) * shape.tokens
        if shape.tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        if self.counting == "textbook":
            return StepCost(2.0 * self.params * shape.tokens / t, attn, self.weight_bytes / t, kv_read, kv_write)
        gemm = 2.0 * (self.layer_linear_params * shape.tokens + self.table_params * shape.sampled) / t
        tables = (self.table_params if shape.sampled else 0) / t + self.norm_params
        gathered = shape.tokens * self.model.hidden_size  # embedding rows looked up
        weights = self.layer_linear_params / t * self.b + (tables + gathered) * self.table_b
        return StepCost(gemm, attn, float(weights), kv_read, kv_write)

    def allreduce_s(self, rows: int, hw: Hardware) -> float:
        """One all-reduce of `rows` activations across the tp GPUs, plus the link's fixed cost: a ring moves
        2(t-1)/t of the message each way over one GPU's link; on an NVSwitch that reduces (NVLink SHARP) the
        message crosses once, at the switch's all-reduce throughput, and NCCL takes the faster of the two (the
        ring at TP2, the switch from TP4). A profile that carries measured times at this degree is interpolated in
        them instead."""
        if self.tp == 1 or rows == 0:
            return 0.0
        if not hw.link_bw > 0:
            raise ConfigError("tp", f"{hw.the_label} profile has no GPU-to-GPU link (link_bw)",
                              "use --tp 1, or a profile with link_bw and link_latency_s")
        message = rows * self.model.hidden_size * self.act_bytes
        measured = hw.allreduce_measured.get(str(self.tp))
        if measured:  # an engine's own all-reduce, timed at this degree (a `-2025` profile)
            return interpolate(measured, message)
        seconds = 2 * (self.tp - 1) / self.tp * message / (hw.link_bw * hw.link_eff)
        if hw.allreduce_in_switch:
            seconds = min(seconds, message / (hw.link_bw * hw.switch_allreduce_share))
        return seconds + hw.link_latency_s

    def overhead_s(self, shape: StepShape, hw: Hardware) -> float:
        """Fixed costs: per step (smaller when a decode-only step replays a CUDA graph) and per sequence."""
        graphed = self.cuda_graphs and shape.tokens == shape.sequences  # every chunk one row: decode only
        step = hw.graph_step_overhead_s if graphed else hw.step_overhead_s
        prompt = hw.prefill_overhead_s if shape.tokens > shape.sequences else 0.0  # a chunk of more than one row
        return step + prompt + hw.seq_overhead_s * shape.sequences

    def time(self, shape: StepShape, hw: Hardware) -> StepTime:
        if shape.tokens == 0:
            return StepTime(0.0, 0.0, 0.0)
        if hw.cost_model == "operators":
            return operator_time(self, shape, hw)
        c = self.cost(shape)
        compute = c.gemm_flops / (hw.gemm_peak * hw.gemm_efficiency) + c.attn_flops / (hw.peak_flops * hw.attn_eff)
        memory = c.bytes / (hw.mem_bw * hw.mem_eff)
        comm = 2 * self.model.num_layers * self.allreduce_s(shape.tokens, hw)
        return StepTime(compute, memory, self.overhead_s(shape, hw), comm)

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
        """Tokens of K/V that fit beside one GPU's weight shard in `utilization` of its memory (each GPU
        holds its heads' share of every token, so this is the whole deployment's room too)."""
        return int(self._kv_room_bytes(hw, utilization) // self.kv_bytes_per_token_per_gpu)

    def kv_room_share(self, hw: Hardware, utilization: float = 0.9) -> float:
        """The share of one GPU's memory left for K/V beside its weight shard: where it is small, how much
        room a real runtime keeps back (its context, activations, graphs) decides the batch it can hold."""
        return self._kv_room_bytes(hw, utilization) / hw.memory_bytes

    def _kv_room_bytes(self, hw: Hardware, utilization: float) -> float:
        return max(0.0, hw.memory_bytes * utilization - self.weight_bytes_per_gpu)
