"""CUDA attention with flash-attn over the paged cache: one kernel call per layer for any step.

- prefill, chunked prefill and mixed steps: `flash_attn_varlen_func` with `block_table`; flash-attn
  aligns its causal mask bottom-right, so a chunk after a cached prefix and a decode row are both
  "the last T of seq_len keys", exactly the paged-prefill semantics;
- steps of one-token chunks only: `flash_attn_with_kvcache` with `cache_seqlens`, which reads no
  host value and so can be captured in a CUDA graph.

flash-attn's paged KV needs blocks of a multiple of `FLASH_BLOCK_MULTIPLE` tokens; the engine
chooses or checks the block size before the cache is built (`attention.choose`). New K/V rows are
written by the Triton store kernel where Triton is present (it ships with CUDA builds of torch),
else by `index_copy_`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from itlbench.engine.batch import FlatBatch

try:
    from flash_attn import flash_attn_varlen_func as _varlen
    from flash_attn import flash_attn_with_kvcache as _with_kvcache

    HAS_FLASH_ATTN = True
except Exception:  # noqa: BLE001 - missing wheel or a CUDA/ABI mismatch both mean "unavailable"
    _varlen = _with_kvcache = None
    HAS_FLASH_ATTN = False

FLASH_BLOCK_MULTIPLE = 256


def available(device: torch.device, block_size: int | None = None,
              dtype: torch.dtype | None = None) -> tuple[bool, str]:
    """Whether this backend can run here, and why not (block_size None: not checked yet)."""
    if not HAS_FLASH_ATTN:
        return False, "flash_attn is not installed (pip install flash-attn on a CUDA machine)"
    if device.type != "cuda":
        return False, "flash_attn needs a CUDA device"
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        return False, f"flash_attn runs float16/bfloat16 only, not {dtype}"
    if block_size is not None and block_size % FLASH_BLOCK_MULTIPLE:
        return False, f"flash_attn paged KV needs block_size % {FLASH_BLOCK_MULTIPLE} == 0, got {block_size}"
    return True, ""


@dataclass
class FlashMetadata:
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor  # cu_seqlens_q [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    block_tables: torch.Tensor  # [R, max_blocks] int32
    decode_only: bool
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 1
    max_seqlen_k: int = 0


def _store_fn(device: torch.device):  # noqa: ANN202 - returns one of two store functions
    from itlbench.engine.attention import triton_backend

    if not triton_backend.available(device)[0]:
        return _index_store
    try:
        from itlbench.engine.attention import triton_kernels

        return triton_kernels.store_kv
    except Exception:  # noqa: BLE001 - a broken Triton install: plain indexed copies
        return _index_store


def _index_store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


class FlashBackend:
    name = "flash"
    graph_capable = True

    def __init__(self, device: torch.device) -> None:
        ok, why = available(device)
        if not ok:
            raise RuntimeError(why)
        self.device = device
        self._store = _store_fn(device)

    def prepare(self, batch: FlatBatch) -> FlashMetadata:
        qlens = batch.query_lens_np
        if int(qlens.max(initial=1)) == 1:
            return FlashMetadata(batch.slot_mapping, batch.query_start_loc, batch.seq_lens, batch.block_tables, True)
        cu_k = np.zeros(batch.num_reqs + 1, np.int32)
        np.cumsum(batch.seq_lens_np, out=cu_k[1:])
        return FlashMetadata(batch.slot_mapping, batch.query_start_loc, batch.seq_lens, batch.block_tables, False,
                             torch.from_numpy(cu_k).to(self.device), int(qlens.max()),
                             int(batch.seq_lens_np.max()))

    def decode_metadata(self, slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor) -> FlashMetadata:
        return FlashMetadata(slot_mapping, query_start_loc, seq_lens, block_tables, True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: FlashMetadata) -> torch.Tensor:
        self._store(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.decode_only:
            out = _with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.seq_lens,
                                block_table=meta.block_tables, causal=True)
            return out.squeeze(1)
        return _varlen(q, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, cu_seqlens_k=meta.cu_seqlens_k,
                       max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k, causal=True,
                       block_table=meta.block_tables)
