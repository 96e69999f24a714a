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
        part_out_ptr, part_lse_ptr,
        stride_qn, stride_qh, stride_on, stride_oh, stride_slot, stride_bt,
        stride_ps, stride_pn, stride_ls, stride_ln,
        sm_scale_log2, num_splits,
        G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits

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
        kv_start = 0
        if SPLIT:  # this program takes one BLOCK_N-aligned share of the keys
            share = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
            kv_start = split * share
            kv_end = tl.minimum(kv_end, kv_start + share)
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for start in range(kv_start, kv_end, BLOCK_N):
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

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        if SPLIT:  # fp32 partial output and its log2-sum-exp; an empty share has lse = -inf
            lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
            tl.store(part_out_ptr + split * stride_ps + q_rows[:, None] * stride_pn + head[:, None] * HEAD_DIM
                     + d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])
            tl.store(part_lse_ptr + split * stride_ls + q_rows * stride_ln + head, lse, mask=row_ok)
        else:
            tl.store(out_ptr + q_rows[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_splits,
                           stride_ps, stride_pn, stride_ls, stride_ln, stride_on, stride_oh,
                           HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """Row `n`, head `h`: the splits' partial outputs weighted by their share of the softmax mass."""
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    sp_ok = sp < num_splits
    lse = tl.load(part_lse_ptr + sp * stride_ls + n * stride_ln + h, mask=sp_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(sp_ok & (lse > float("-inf")), tl.exp2(lse - m), 0.0)
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    parts = tl.load(part_out_ptr + sp[:, None] * stride_ps + n * stride_pn + h * HEAD_DIM + d[None, :],
                    mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + n * stride_on + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def tile_sizes(num_heads: int, num_kv_heads: int, max_query_len: int) -> tuple[int, int, int]:
    """(G_PAD, BLOCK_Q, BLOCK_N). Rows per tile = BLOCK_Q * G_PAD: at least 16 (tensor-core dots),
    64 for chunks of many queries so a long prefill reuses each key tile across rows."""
    g_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    rows = 16 if max_query_len == 1 else 64
    block_q = max(1, rows // g_pad)
    return g_pad, block_q, 64


MAX_SPLITS = 16


def decode_splits(num_reqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Key-range splits for a decode step (flash-decoding): enough programs for two per SM when the
    batch alone gives too few; depends on the batch shape only, so a CUDA graph can fix it."""
    return max(1, min(MAX_SPLITS, -(-2 * num_sms // max(1, num_reqs * num_kv_heads))))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    max_query_len: int, out: torch.Tensor | None = None,
                    sm_scale: float | None = None, num_splits: int = 1) -> torch.Tensor:
    """q [N, H, D] (rows strided, last dim contiguous); caches [blocks, block_size, KVH, D];
    block_tables [R, max_blocks] int32; query_start_loc [R + 1] int32; seq_lens [R] int32 (context
    after this step). `max_query_len` and `num_splits` only shape the launch (a CUDA graph fixes
    them); with `num_splits > 1` each (request, KV head) splits its keys over that many programs
    and a second kernel combines them."""
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
    d_pad = max(16, triton.next_power_of_2(dim))
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(dim)) * math.log2(math.e)
    split = num_splits > 1
    if split:
        part_out = torch.empty((num_splits, n, heads, dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, n, heads), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), kv_heads * num_splits)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens, part_out, part_lse,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), kv_heads * dim, block_tables.stride(0),
        part_out.stride(0) if split else 0, part_out.stride(1) if split else 0,
        part_lse.stride(0) if split else 0, part_lse.stride(1) if split else 0,
        scale, num_splits,
        G=heads // kv_heads, G_PAD=g_pad, HEAD_DIM=dim, D_PAD=d_pad,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_N=block_n, SPLIT=split)
    if split:
        _combine_splits_kernel[(n, heads)](
            part_out, part_lse, out, num_splits, part_out.stride(0), part_out.stride(1), part_lse.stride(0),
            part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=dim, D_PAD=d_pad, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)))
    return out
