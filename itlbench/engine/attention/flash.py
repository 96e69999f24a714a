"""CUDA attention with flash-attn's paged varlen kernel: one call per layer for a mixed batch.

flash-attn aligns its causal mask bottom-right, so a chunk after a cached prefix and a decode row
are both "the last T of seq_len keys", exactly the paged-prefill semantics. Upstream flash-attn
needs paged blocks in multiples of 256 tokens; `available` says whether this setup qualifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from itlbench.engine.batch import FlatBatch

try:
    from flash_attn import flash_attn_varlen_func as _varlen

    HAS_FLASH_ATTN = True
except Exception:  # noqa: BLE001 - missing wheel or a CUDA/ABI mismatch both mean "unavailable"
    _varlen = None
    HAS_FLASH_ATTN = False

FLASH_BLOCK_MULTIPLE = 256


def available(device: torch.device, block_size: int) -> tuple[bool, str]:
    """Whether this backend can run here, and why not."""
    if not HAS_FLASH_ATTN:
        return False, "flash_attn is not installed"
    if device.type != "cuda":
        return False, "flash_attn needs a CUDA device"
    if block_size % FLASH_BLOCK_MULTIPLE:
        return False, f"flash_attn paged KV needs block_size % {FLASH_BLOCK_MULTIPLE} == 0, got {block_size}"
    return True, ""


@dataclass
class FlashMetadata:
    slot_mapping: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    block_tables: torch.Tensor


class FlashBackend:
    name = "flash"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def prepare(self, batch: FlatBatch) -> FlashMetadata:
        cu_k = torch.zeros(batch.num_reqs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(batch.seq_lens, 0, out=cu_k[1:])
        return FlashMetadata(batch.slot_mapping, batch.query_start_loc, cu_k,
                             int(batch.query_lens_np.max()), int(batch.seq_lens_np.max()), batch.block_tables)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: FlashMetadata) -> torch.Tensor:
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v)
        return _varlen(q, k_cache, v_cache, cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_k=meta.cu_seqlens_k,
                       max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k, causal=True,
                       block_table=meta.block_tables)
