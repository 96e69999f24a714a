"""Paged attention with `scaled_dot_product_attention`: runs on any device torch runs on.

Per step, `prepare` sorts chunks into three kinds so each layer does the least work:
- fresh: a multi-token chunk at position 0 attends only to itself: `is_causal=True`, no gather;
- extend: a chunk after a cached prefix gathers its K/V from the block table, with a causal mask
  offset by the prefix;
- decode: one-row chunks. On a CPU with the native kernel (native.py), all of them go into one call
  that reads each sequence's blocks in place, K once and V once, with no padding. Otherwise they go
  into padded SDPA calls with a key-padding mask, one per group of similar context lengths so a
  long-context outlier does not inflate every row's padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from itlbench.engine.batch import FlatBatch
from itlbench.engine.cpu import native


@dataclass
class _Extend:
    rows: slice
    seq_len: int
    block_ids: torch.Tensor  # [num_blocks]
    mask: torch.Tensor  # [T, seq_len] bool, True = attend


@dataclass
class _Single:
    rows: torch.Tensor | None  # [B] row indices; None when the batch is only these rows, in order
    block_tables: torch.Tensor  # [B, max_blocks]
    mask: torch.Tensor | None  # [B, 1, 1, S] bool; None when all contexts fill S exactly
    max_len: int


@dataclass
class _NativeDecode:
    """Every decode row of the step, for one native kernel call per layer."""

    rows: torch.Tensor  # [n] int64 row of q/out
    tables: torch.Tensor  # [n, max_blocks] int32
    lens: torch.Tensor  # [n] int32 context length
    max_len: int
    batch: FlatBatch  # to build padded SDPA groups instead, for a dtype the kernel lacks
    idx: np.ndarray
    qsl: np.ndarray


@dataclass
class SdpaMetadata:
    slot_mapping: torch.Tensor
    fresh: list[slice]
    extend: list[_Extend]
    single: list[_Single]  # decode rows, grouped by context length (when not native)
    native: _NativeDecode | None = None


class SdpaBackend:
    name = "sdpa"

    def __init__(self, device: torch.device, use_native: bool = True) -> None:
        self.device = torch.device(device)
        self.kernel = native.load() if use_native and self.device.type == "cpu" else None
        self._scratch = torch.empty(0)

    @property
    def decode_kernel(self) -> str:
        """What decode rows run on: "native" (paged_decode.c) or "sdpa" (gathered, padded)."""
        return "native" if self.kernel is not None else "sdpa"

    def prepare(self, batch: FlatBatch) -> SdpaMetadata:
        fresh: list[slice] = []
        extend: list[_Extend] = []
        if batch.num_tokens == batch.num_reqs:  # one row per chunk (decode steps): no chunk to split
            qsl = np.arange(batch.num_reqs + 1, dtype=np.int64)
            decode_idx = qsl[:-1]
        else:
            qlens, starts = batch.query_lens_np, batch.starts_np
            qsl = np.concatenate(([0], np.cumsum(qlens)))
            for i in np.flatnonzero(qlens > 1):
                rows = slice(int(qsl[i]), int(qsl[i + 1]))
                if starts[i] == 0:
                    fresh.append(rows)
                else:
                    extend.append(self._extend(batch, int(i), rows))
            decode_idx = np.flatnonzero(qlens == 1)
        if self.kernel is not None and len(decode_idx):
            return SdpaMetadata(batch.slot_mapping, fresh, extend, [], self._native(batch, decode_idx, qsl))
        groups = _length_groups(decode_idx, batch.seq_lens_np)
        return SdpaMetadata(batch.slot_mapping, fresh, extend, [self._single(batch, g, qsl) for g in groups])

    def _native(self, batch: FlatBatch, idx: np.ndarray, qsl: np.ndarray) -> _NativeDecode:
        lens = batch.seq_lens_np[idx]
        max_len = int(lens.max())
        nblocks = -(-max_len // batch.block_size)
        if (len(idx) == batch.num_reqs == batch.num_tokens and batch.block_tables_np.shape[1] == nblocks
                and batch.block_tables.dtype == batch.seq_lens.dtype == torch.int32):
            # every row decodes: the batch's own tables and lengths serve as they are (no copies)
            return _NativeDecode(torch.from_numpy(qsl[:-1]), batch.block_tables.contiguous(),
                                 batch.seq_lens.contiguous(), max_len, batch, idx, qsl)
        tables = np.ascontiguousarray(batch.block_tables_np[idx, :nblocks], dtype=np.int32)
        return _NativeDecode(torch.from_numpy(np.ascontiguousarray(qsl[idx], dtype=np.int64)),
                             torch.from_numpy(tables), torch.from_numpy(lens.astype(np.int32)), max_len,
                             batch, idx, qsl)

    def _extend(self, batch: FlatBatch, i: int, rows: slice) -> _Extend:
        start, seq_len = int(batch.starts_np[i]), int(batch.seq_lens_np[i])
        nblocks = -(-seq_len // batch.block_size)
        q_pos = torch.arange(start, seq_len, device=self.device)
        k_pos = torch.arange(seq_len, device=self.device)
        return _Extend(rows, seq_len, batch.block_tables[i, :nblocks].long(), k_pos[None, :] <= q_pos[:, None])

    def _single(self, batch: FlatBatch, idx: np.ndarray, qsl: np.ndarray) -> _Single:
        seq_lens = batch.seq_lens_np[idx]
        max_len = int(seq_lens.max())
        nblocks = -(-max_len // batch.block_size)
        tables = torch.from_numpy(batch.block_tables_np[idx, :nblocks]).to(self.device)
        only_singles = len(idx) == batch.num_reqs and bool(np.all(np.diff(idx) == 1))
        rows = None if only_singles else torch.from_numpy(qsl[idx]).to(self.device)
        mask = None
        if (seq_lens != max_len).any():
            lens = torch.from_numpy(seq_lens).to(self.device)
            mask = (torch.arange(max_len, device=self.device)[None, :] < lens[:, None])[:, None, None, :]
        return _Single(rows, tables, mask, max_len)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: SdpaMetadata) -> torch.Tensor:
        """q [N, H, D], k/v [N, KVH, D]; caches [num_blocks, block_size, KVH, D] → [N, H, D]."""
        if self.kernel is None or not self.kernel.write_kv(k, v, k_cache, v_cache, meta.slot_mapping):
            flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
            flat_k.index_copy_(0, meta.slot_mapping, k)
            flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if meta.native is not None:
            if q.dtype == k_cache.dtype == torch.float32 and k_cache.is_contiguous() and v_cache.is_contiguous():
                self._native_decode(q, k_cache, v_cache, meta.native, out)
            else:  # the kernel is fp32-only: this step, and every later layer of it, pads instead
                n, meta.native = meta.native, None
                meta.single = [self._single(n.batch, g, n.qsl) for g in _length_groups(n.idx, n.batch.seq_lens_np)]
        for rows in meta.fresh:
            out[rows] = _sdpa(q[rows], k[rows], v[rows], causal=True)
        for e in meta.extend:
            prefix = e.seq_len - (e.rows.stop - e.rows.start)
            if _FLASH_LSE is not None and q.device.type == "cpu":
                kk = _gather(k_cache, e.block_ids)[:prefix]
                vv = _gather(v_cache, e.block_ids)[:prefix]
                out[e.rows] = _extend_split(q[e.rows], k[e.rows], v[e.rows], kk, vv)
                continue
            kk = _gather(k_cache, e.block_ids)[: e.seq_len]
            vv = _gather(v_cache, e.block_ids)[: e.seq_len]
            out[e.rows] = _sdpa(q[e.rows], kk, vv, mask=e.mask)
        for group in meta.single:
            out = self._decode(q, k_cache, v_cache, group, out)
        return out

    def _native_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n: _NativeDecode,
                       out: torch.Tensor) -> None:
        assert self.kernel is not None
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        threads = torch.get_num_threads()
        per_thread = (q.shape[1] // k_cache.shape[2]) * n.max_len
        self._scratch = native.grown(self._scratch, threads * per_thread)
        self.kernel(q, n.rows, k_cache, v_cache, n.tables, n.lens, out, q.shape[2] ** -0.5, self._scratch,
                    per_thread, threads)

    @staticmethod
    def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, s: _Single,
                out: torch.Tensor) -> torch.Tensor:
        """All one-row chunks in one call. The query heads sharing a KV head ride in SDPA's query-length
        axis ([B, KVH, G, D]), so grouped-query attention needs no key/value repeat."""
        qs = q if s.rows is None else q[s.rows]
        batch, heads, dim = qs.shape
        kv_heads = k_cache.shape[2]
        shape = (batch, s.block_tables.shape[1] * k_cache.shape[1], kv_heads, dim)
        kk = _gather(k_cache, s.block_tables.flatten()).view(shape)[:, : s.max_len].transpose(1, 2)
        vv = _gather(v_cache, s.block_tables.flatten()).view(shape)[:, : s.max_len].transpose(1, 2)
        qg = qs.view(batch, kv_heads, heads // kv_heads, dim)
        o = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=s.mask).reshape(batch, heads, dim)
        if s.rows is None:
            return o
        out[s.rows] = o
        return out


PAD_LIMIT = 1.25  # a decode row is padded to at most this times its own context


def _length_groups(idx: np.ndarray, seq_lens: np.ndarray) -> list[np.ndarray]:
    """Decode rows split so that no row is padded past PAD_LIMIT times its own context: decode reads
    every padded key, so one 32k-token request among 8k ones must not make every row read 32k keys,
    and 6k contexts beside 14k ones should not read 14k each."""
    if not len(idx):
        return []
    order = idx[np.argsort(-seq_lens[idx], kind="stable")]
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or seq_lens[order[i]] * PAD_LIMIT < seq_lens[order[start]]:
            groups.append(np.sort(order[start:i]))
            start = i
    return groups


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks `block_ids` of a [num_blocks, block_size, KVH, D] cache as [n * block_size, KVH, D].

    `index_select` on a 2-D view copies whole blocks as rows: several times faster on CPU than
    advanced indexing of the 4-D tensor."""
    rows = torch.index_select(cache.view(cache.shape[0], -1), 0, block_ids)
    return rows.view(-1, *cache.shape[2:])


# CPU flash attention that also returns the log-sum-exp (private aten op; absent: the masked path)
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _extend_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_k: torch.Tensor,
                  prefix_v: torch.Tensor) -> torch.Tensor:
    """A chunk after a cached prefix, without a [T, S] mask: every query attends to all of the
    prefix (no mask; grouped heads ride in the query axis, so K/V are not repeated) and causally to
    the chunk itself; the two partial softmaxes merge by their log-sum-exps. Masked SDPA over the
    whole context costs ~2.7x this on CPU. q [T, H, D], k/v [T, KVH, D], prefix_k/v [P, KVH, D]."""
    t, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qh = q.transpose(0, 1).reshape(1, kv_heads, group * t, dim)  # head h = kv_head * group + g
    pk, pv = prefix_k.transpose(0, 1).unsqueeze(0), prefix_v.transpose(0, 1).unsqueeze(0)
    o1, l1 = _FLASH_LSE(qh, pk, pv, 0.0, False)
    kk = k.transpose(0, 1).unsqueeze(1).expand(kv_heads, group, t, dim).reshape(1, heads, t, dim)
    vv = v.transpose(0, 1).unsqueeze(1).expand(kv_heads, group, t, dim).reshape(1, heads, t, dim)
    o2, l2 = _FLASH_LSE(q.transpose(0, 1).unsqueeze(0), kk, vv, 0.0, True)
    o1, l1 = o1.reshape(1, heads, t, dim), l1.reshape(1, heads, t)
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top).unsqueeze(-1), torch.exp(l2 - top).unsqueeze(-1)
    o = (o1 * w1 + o2 * w2) / (w1 + w2)
    return o.squeeze(0).transpose(0, 1).to(q.dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
          mask: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence: q [T, H, D], k/v [S, KVH, D] → [T, H, D]."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                       v.transpose(0, 1).unsqueeze(0), attn_mask=mask, is_causal=causal,
                                       enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)
