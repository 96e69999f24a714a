"""A stand-in for flash-attn's two entry points (paged varlen and with-kvcache), computed with plain
torch, so the flash backend's bookkeeping is tested on a CPU; the `fake_flash` fixture installs it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from itlbench.engine.attention import flash


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    return cache[table.long()].reshape(-1, *cache.shape[2:])[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [T, H, D] as the last T positions of k/v [S, KVH, D]; causal, bottom-right aligned."""
    t, s = q.shape[0], k.shape[0]
    mask = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                       enable_gqa=True)
    return o.transpose(0, 1)


def _check_paged(k_cache: torch.Tensor, block_table: torch.Tensor) -> None:
    assert k_cache.dim() == 4 and k_cache.shape[1] % 256 == 0, "page_block_size must be a multiple of 256"
    assert block_table.dtype == torch.int32


def fake_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,  # noqa: ANN001, ANN201
                block_table=None):
    assert causal and block_table is not None and cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    _check_paged(k, block_table)
    out = torch.empty_like(q)
    lens_q, lens_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
    assert int(lens_q.max()) <= max_seqlen_q and int(lens_k.max()) <= max_seqlen_k
    for i in range(len(lens_q)):
        a, b, s = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(lens_k[i])
        out[a:b] = _attend(q[a:b], _gather(k, block_table[i], s), _gather(v, block_table[i], s))
    return out


def fake_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False):  # noqa: ANN001, ANN201
    assert causal and q.dim() == 4 and cache_seqlens.dtype == torch.int32
    _check_paged(k_cache, block_table)
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        s = int(cache_seqlens[i])
        out[i] = _attend(q[i], _gather(k_cache, block_table[i], s), _gather(v_cache, block_table[i], s))
    return out


@pytest.fixture
def fake_flash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flash, "HAS_FLASH_ATTN", True)
    monkeypatch.setattr(flash, "_varlen", fake_varlen)
    monkeypatch.setattr(flash, "_with_kvcache", fake_with_kvcache)
    monkeypatch.setattr(flash, "available", lambda *a, **k: (True, ""))
