"""Llama-3 decoder on flattened token rows `[N, d]`; attention is delegated to a paged backend.

Projections are fused (QKV, gate+up) so each layer runs four GEMMs; the loader splits and joins
Hugging Face tensors to this layout. Every product goes through `project`, which uses a weight's
packed copy on CPU (cpu_weights.py: column panels for the native product); every row-wise operator goes through the step's row ops
(row_ops.py: fused C on CPU, torch elsewhere). The residual stream is one tensor per step that each
layer's output is added into in place, fused with the next RMSNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from itlbench.core.model_config import ModelConfig
from itlbench.engine.cpu.weights import project
from itlbench.engine.model.row_ops import TorchRowOps


@dataclass
class ForwardContext:
    """Per-step inputs shared by every layer."""

    cos: torch.Tensor  # [N, D/2]: each row's rotary angles
    sin: torch.Tensor
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (K, V) [blocks, block_size, KVH, D]
    backend: object  # AttentionBackend
    meta: object  # the backend's per-step metadata
    ops: object = TorchRowOps()  # TorchRowOps or NativeRowOps


def _param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    """A norm's weight and epsilon; applied, fused with the residual add, by the step's row ops."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = _param(width, cfg.hidden_size, dtype=dtype, device=device)
        self.o_proj = _param(cfg.hidden_size, cfg.num_heads * cfg.head_dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        n, h, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = project(x, self.qkv_proj).view(n, h + 2 * kvh, self.head_dim)
        ctx.ops.rope_(qkv, h + kvh, ctx.cos, ctx.sin)
        k_cache, v_cache = ctx.kv_caches[self.layer]
        out = ctx.backend.forward(qkv[:, :h], qkv[:, h:h + kvh], qkv[:, h + kvh:], k_cache, v_cache, ctx.meta)
        return project(out.reshape(n, h * self.head_dim), self.o_proj)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.gate_up_proj = _param(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dtype, device=device)
        self.down_proj = _param(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return project(ctx.ops.silu_mul(project(x, self.gate_up_proj)), self.down_proj)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device)

    def forward(self, residual: torch.Tensor, delta: torch.Tensor | None, ctx: ForwardContext) -> torch.Tensor:
        """Adds the previous layer's output `delta` into `residual` (in place); returns this layer's."""
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        h = ctx.ops.add_rms_norm(residual, delta, norm1.weight, norm1.eps)
        h = ctx.ops.add_rms_norm(residual, self.self_attn(h, ctx), norm2.weight, norm2.eps)
        return self.mlp(h, ctx)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.lm_head = None if cfg.tie_word_embeddings else _param(
            cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states [N, d] after the final norm."""
        residual, delta = self.embed(input_ids), None
        for layer in self.layers:
            delta = layer(residual, delta, ctx)
        return ctx.ops.add_rms_norm(residual, delta, self.norm.weight, self.norm.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head, applied only to the rows that sample."""
        return project(hidden, self.embed_tokens if self.lm_head is None else self.lm_head)
