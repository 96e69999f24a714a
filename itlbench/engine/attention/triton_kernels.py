"""Triton kernels over the paged KV cache: a KV store and one attention kernel for every step kind.

Layout (shared with the SDPA backend): caches are `[num_blocks, block_size, KVH, D]`; a request's
logical token `j` lives in block `block_tables[r, j // block_size]` at offset `j % block_size`.

`paged_attention` handles prefill, chunked prefill after a cached prefix, decode and mixed steps in
one launch. A program owns one request, one KV head and a tile of `BLOCK_Q` query tokens; the
`G` query heads that share the KV head ride along as rows, so a tile is `BLOCK_Q * G_PAD` rows
against keys streamed `BLOCK_N` at a time (each key's slot looked up through the block table, so
any block size works and no K/V is ever gathered into a copy). Softmax is the online (flash)
form in fp32; the causal mask is bottom-right aligned: query `i` of a chunk that ends the context
sits at position `seq_len - q_len + i` and sees keys up to it.

This module imports `triton` at import time; import it only through `load()`, which says why it
cannot be used here. Under `TRITON_INTERPRET=1` the kernels run on CPU tensors (tests).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_k, stride_v, stride_slot,
                     ROW: tl.constexpr, ROW_PAD: tl.constexpr):
    """Row `i` of k/v ([KVH * D] contiguous) to slot `slot_mapping[i]`; a negative slot writes nothing."""
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, ROW_PAD)
        mask = offs < ROW
        k = tl.load(k_ptr + i.to(tl.int64) * stride_k + offs, mask=mask)
        v = tl.load(v_ptr + i.to(tl.int64) * stride_v + offs, mask=mask)
        tl.store(k_cache_ptr + slot * stride_slot + offs, k, mask=mask)
        tl.store(v_cache_ptr + slot * stride_slot + offs, v, mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k/v [N, KVH, D] (rows may be strided, heads packed) into the caches at `slot_mapping` [N]."""
    n, kvh, d = k.shape
    for t in (k, v):
        if t.stride(2) != 1 or t.stride(1) != d:
            raise ValueError("store_kv needs each row's heads packed contiguously")
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("store_kv needs contiguous caches")
    if n == 0:
        return
    row = kvh * d
    _store_kv_kernel[(n,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), row,
                           ROW=row, ROW_PAD=triton.next_power_of_2(row))


@triton.jit
def _paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr,
        stride_qn, stride_qh, stride_on, stride_oh, stride_slot, stride_bt,
        sm_scale_log2,
        G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if tile * BLOCK_Q < q_len:
        ctx_start = seq_len - q_len  # position of the chunk's first query token
        rows = tl.arange(0, BLOCK_Q * G_PAD)
        qi = tile * BLOCK_Q + rows // G_PAD  # query token within the chunk
        g = rows % G_PAD
        row_ok = (qi < q_len) & (g < G)
        head = kv_head * G + g
        q_pos = ctx_start + qi
        d = tl.arange(0, D_PAD)
        d_ok = d < HEAD_DIM

        q_rows = (q_start + qi).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qn + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)

        m_i = tl.full([BLOCK_Q * G_PAD], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_Q * G_PAD], tl.float32)
        acc = tl.zeros([BLOCK_Q * G_PAD, D_PAD], tl.float32)

        # keys past the tile's last query position are masked for every row: stop before them
        last_q = tl.minimum(q_len, (tile + 1) * BLOCK_Q)
        kv_end = ctx_start + last_q
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for start in range(0, kv_end, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < kv_end
            block = tl.load(bt_row + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
            slots = block * BLOCK_SIZE + keys % BLOCK_SIZE
            kv_off = slots[:, None] * stride_slot + kv_head * HEAD_DIM + d[None, :]
            kv_mask = key_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)

            s = tl.dot(q, tl.trans(k)) * sm_scale_log2  # [rows, BLOCK_N], log2 domain
            visible = (keys[None, :] <= q_pos[:, None]) & key_ok[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        l_i = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_i[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def tile_sizes(num_heads: int, num_kv_heads: int, max_query_len: int) -> tuple[int, int, int]:
    """(G_PAD, BLOCK_Q, BLOCK_N). Rows per tile = BLOCK_Q * G_PAD: at least 16 (tensor-core dots),
    64 for chunks of many queries so a long prefill reuses each key tile across rows."""
    g_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    rows = 16 if max_query_len == 1 else 64
    block_q = max(1, rows // g_pad)
    return g_pad, block_q, 64


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    max_query_len: int, out: torch.Tensor | None = None,
                    sm_scale: float | None = None) -> torch.Tensor:
    """q [N, H, D] (rows strided, last dim contiguous); caches [blocks, block_size, KVH, D];
    block_tables [R, max_blocks] int32; query_start_loc [R + 1] int32; seq_lens [R] int32 (context
    after this step). `max_query_len` only sizes the grid: a CUDA graph captures it fixed."""
    n, heads, dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if q.stride(2) != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("paged_attention needs a contiguous head dim and contiguous caches")
    if out is None:
        out = torch.empty((n, heads, dim), dtype=q.dtype, device=q.device)
    num_reqs = seq_lens.shape[0]
    if n == 0 or num_reqs == 0:
        return out
    g_pad, block_q, block_n = tile_sizes(heads, kv_heads, max_query_len)
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)) * math.log2(math.e)
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), kv_heads * dim, block_tables.stride(0),
        scale,
        G=heads // kv_heads, G_PAD=g_pad, HEAD_DIM=dim, D_PAD=max(16, triton.next_power_of_2(dim)),
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_N=block_n)
    return out
