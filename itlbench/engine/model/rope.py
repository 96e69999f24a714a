"""Rotary position embedding tables, with Llama-3.1's "llama3" and plain "linear" frequency scaling."""

from __future__ import annotations

import math

import torch

from itlbench.core.model_config import ModelConfig, RopeScaling


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Per-pair rotation frequencies [head_dim/2] (float64).

    linear scaling divides every frequency by `factor` (positions interpolated). llama3 scaling
    divides low frequencies (wavelength above original_len / low_freq_factor) by `factor`, keeps
    high ones, and blends linearly in between.
    """
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is None:
        return inv
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    old = scaling.original_max_position_embeddings
    low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv / scaling.factor + smooth * inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rope_tables(cfg: ModelConfig, max_len: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position × frequency, each [max_len, head_dim/2], computed once."""
    inv = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)

