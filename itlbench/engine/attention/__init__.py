"""Attention backends over the paged KV cache; `select_backend` picks one for a device."""

from __future__ import annotations

from typing import Protocol

import torch

from itlbench.engine.attention import flash
from itlbench.engine.attention.sdpa import SdpaBackend
from itlbench.engine.batch import FlatBatch
from itlbench.errors import ConfigError

BACKENDS = ("auto", "sdpa", "flash")


class AttentionBackend(Protocol):
    name: str

    def prepare(self, batch: FlatBatch) -> object:
        """Per-step metadata, built once and shared by every layer."""
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: object) -> torch.Tensor:
        """Write k/v into the cache at the batch's slots, attend, return [N, H, D]."""
        ...


def select_backend(device: torch.device | str, requested: str = "auto", block_size: int = 16) -> AttentionBackend:
    """`flash` when asked (or on CUDA under auto) and usable, else `sdpa`."""
    device = torch.device(device)
    if requested not in BACKENDS:
        raise ConfigError("attention_backend", f"unknown backend {requested!r}", f"use one of {', '.join(BACKENDS)}")
    ok, why = flash.available(device, block_size)
    if requested == "flash":
        if not ok:
            raise ConfigError("attention_backend", f"flash unavailable: {why}", "use sdpa or auto")
        return flash.FlashBackend(device)
    if requested == "auto" and ok:
        return flash.FlashBackend(device)
    return SdpaBackend(device)


__all__ = ["AttentionBackend", "BACKENDS", "SdpaBackend", "select_backend"]
