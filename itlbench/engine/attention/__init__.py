"""Attention backends over the paged KV cache, chosen once at start-up (`--attention`).

| name | where | what |
| --- | --- | --- |
| sdpa | anywhere torch runs | `scaled_dot_product_attention`; the reference and the CPU path |
| triton | CUDA (or CPU under TRITON_INTERPRET=1) | this package's own store and paged-attention kernels |
| flash | CUDA with flash-attn | flash-attn's varlen / kvcache kernels over the paged cache (blocks of a multiple of 256 tokens) |

`auto` takes flash, then triton, then sdpa, whichever can run first, and logs one line saying what
it took and why it passed over the others. Naming a backend that cannot run is a `ConfigError` on
the `attention` field. flash-attn only pages KV in blocks of a multiple of 256 tokens: with the
default block size flash gets 256-token blocks (and says so); another block size that is not such
a multiple is an error under `--attention flash` and skips flash under `auto`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from itlbench.core.engine_config import ATTENTION_BACKENDS, EngineConfig
from itlbench.engine.attention import flash, triton_backend
from itlbench.engine.attention.sdpa import SdpaBackend
from itlbench.engine.batch import FlatBatch
from itlbench.errors import ConfigError

BACKENDS = ATTENTION_BACKENDS
DEFAULT_BLOCK_SIZE = 16  # EngineConfig.block_size's default; the one block size flash may replace
FLASH_BLOCK_SIZE = flash.FLASH_BLOCK_MULTIPLE


class AttentionBackend(Protocol):
    name: str

    def prepare(self, batch: FlatBatch) -> object:
        """Per-step metadata, built once and shared by every layer."""
        ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: object) -> torch.Tensor:
        """Write k/v into the cache at the batch's slots, attend, return [N, H, D]."""
        ...


@dataclass(frozen=True)
class AttentionChoice:
    backend: str  # sdpa | triton | flash
    block_size: int  # the KV block size the cache must use
    note: str  # one line for the log: what was chosen and why


def _flash_block_size(block_size: int) -> int | None:
    """The block size flash would run with: this one, 256 for the default, None if it cannot."""
    if block_size % FLASH_BLOCK_SIZE == 0:
        return block_size
    return FLASH_BLOCK_SIZE if block_size == DEFAULT_BLOCK_SIZE else None


def choose(requested: str, device: torch.device | str, block_size: int = DEFAULT_BLOCK_SIZE,
           dtype: torch.dtype | None = None) -> AttentionChoice:
    """Resolve `--attention` (and the block size it implies) for this device, or raise ConfigError."""
    device = torch.device(device)
    if requested not in BACKENDS:
        raise ConfigError("attention", f"unknown backend {requested!r}", f"use one of {', '.join(BACKENDS)}")
    flash_ok, flash_why = flash.available(device, None, dtype)
    triton_ok, triton_why = triton_backend.available(device)
    flash_bs = _flash_block_size(block_size)
    resized = "" if flash_bs == block_size else (
        f"; KV blocks of {flash_bs} tokens instead of the default {block_size}, since flash-attn "
        f"pages KV in multiples of {FLASH_BLOCK_SIZE}")
    if requested == "flash":
        if not flash_ok:
            raise ConfigError("attention", f"flash is unavailable: {flash_why}",
                              "use --attention auto, triton or sdpa")
        if flash_bs is None:
            raise ConfigError("block_size", f"{block_size} is not a multiple of {FLASH_BLOCK_SIZE}, which "
                              "flash-attn's paged KV cache needs",
                              f"use --block-size {FLASH_BLOCK_SIZE} with --attention flash, or --attention triton")
        return AttentionChoice("flash", flash_bs, f"attention: flash (requested){resized}")
    if requested == "triton":
        if not triton_ok:
            raise ConfigError("attention", f"triton is unavailable: {triton_why}", "use --attention auto or sdpa")
        return AttentionChoice("triton", block_size, "attention: triton (requested)")
    if requested == "sdpa":
        return AttentionChoice("sdpa", block_size, "attention: sdpa (requested)")
    if device.type != "cuda":
        return AttentionChoice("sdpa", block_size, f"attention: sdpa (auto; {device.type} device, the CUDA "
                               "backends flash and triton need CUDA)")
    if flash_ok and flash_bs is not None:
        return AttentionChoice("flash", flash_bs, f"attention: flash (auto){resized}")
    if flash_ok:
        flash_why = f"block size {block_size} is not a multiple of {FLASH_BLOCK_SIZE}"
    if triton_ok:
        return AttentionChoice("triton", block_size, f"attention: triton (auto; flash skipped: {flash_why})")
    return AttentionChoice("sdpa", block_size, f"attention: sdpa (auto; flash skipped: {flash_why}; "
                           f"triton skipped: {triton_why})")


def preflight(config: EngineConfig) -> AttentionChoice:
    """The choice an engine with this config would make here, or the ConfigError it would raise:
    lets `itlbench run` reject `--attention flash` before it starts a server."""
    from itlbench.engine.device import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    return choose(config.attention, device, config.block_size, resolve_dtype(config.dtype, device))


def make_backend(name: str, device: torch.device | str) -> AttentionBackend:
    device = torch.device(device)
    if name == "flash":
        return flash.FlashBackend(device)
    if name == "triton":
        return triton_backend.TritonBackend(device)
    if name == "sdpa":
        return SdpaBackend(device)
    raise ConfigError("attention", f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")


__all__ = ["AttentionBackend", "AttentionChoice", "BACKENDS", "DEFAULT_BLOCK_SIZE", "FLASH_BLOCK_SIZE",
           "SdpaBackend", "choose", "make_backend", "preflight"]
