"""A plain Llama-3 forward for checking the engine: no cache, no flattening, whole sequence.

Written from the Hugging Face weight layout and the published formulas, sharing no code with
`itlbench.engine.model`.
"""

from __future__ import annotations

import math

import torch

from itlbench.core.model_config import ModelConfig


def llama3_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Per-frequency loop straight from the Llama-3.1 reference (`apply_scaling`)."""
    d = cfg.head_dim
    base = [1.0 / (cfg.rope_theta ** (i / d)) for i in range(0, d, 2)]
    s = cfg.rope_scaling
    if s is None:
        return torch.tensor(base, dtype=torch.float64)
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    out = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor)
            out.append((1 - smooth) * f / s.factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; pairs (i, i + D/2) rotated by angles [T, D/2]."""
    half = x.shape[-1] // 2
    c, s = angles.cos()[:, None, :].float(), angles.sin()[:, None, :].float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], -1)


@torch.no_grad()
def reference_logits(w: dict[str, torch.Tensor], cfg: ModelConfig, tokens: list[int]) -> torch.Tensor:
    """Logits [T, vocab] at every position of `tokens`."""
    T, H, KV, D = len(tokens), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    angles = torch.arange(T, dtype=torch.float64)[:, None] * llama3_inv_freq(cfg)[None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = _rotate((h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, D), angles)
        k = _rotate((h @ w[p + "self_attn.k_proj.weight"].T).view(T, KV, D), angles)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, KV, D)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = torch.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], cfg.rms_norm_eps)
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return x @ head.T


def reference_greedy(w: dict[str, torch.Tensor], cfg: ModelConfig, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence every step."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(reference_logits(w, cfg, seq)[-1].argmax()))
    return seq[len(prompt):]
