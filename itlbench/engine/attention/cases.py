"""Synthetic paged-attention steps (a batch of chunks over a shuffled cache) for the backend tests and
`benchmarks/gpu_check.py`: every backend gets the same inputs, SDPA is the reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from itlbench.engine.batch import FlatBatch


@dataclass
class Case:
    batch: FlatBatch
    q: torch.Tensor  # [N, H, D]
    k: torch.Tensor  # [N, KVH, D] this step's new rows
    v: torch.Tensor
    k_cache: torch.Tensor  # [blocks, block_size, KVH, D], earlier context already written
    v_cache: torch.Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Case:
        """The same step on another device and/or in another float type (indices keep theirs)."""
        b = self.batch

        def idx(x: torch.Tensor) -> torch.Tensor:
            return x.to(device)

        def val(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, dtype or x.dtype)

        fused = torch.cat([self.q, self.k, self.v], 1).to(device, dtype or self.q.dtype)
        h, kvh = self.q.shape[1], self.k.shape[1]
        batch = FlatBatch(idx(b.input_ids), idx(b.positions), idx(b.slot_mapping), idx(b.query_start_loc),
                          idx(b.seq_lens), idx(b.block_tables), idx(b.logits_indices), b.request_ids,
                          b.sample_requests, b.query_lens_np, b.starts_np, b.seq_lens_np, b.block_tables_np,
                          b.block_size)
        return Case(batch, fused[:, :h], fused[:, h:h + kvh], fused[:, h + kvh:], val(self.k_cache),
                    val(self.v_cache))


def make_case(starts: list[int], q_lens: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int,
              dtype: torch.dtype = torch.float32, seed: int = 0, spare_blocks: int = 3,
              device: torch.device | str = "cpu", layout: str = "shuffled") -> Case:
    """Request i has `starts[i]` cached tokens and `q_lens[i]` new ones this step. `layout` says
    where their blocks lie: "shuffled" (so that a kernel reading the wrong block cannot pass), "in
    order" (each request's blocks consecutive, as a fresh cache gives a prompt) or "appended" (in
    order but for each request's last block, taken after every request's run, as decode appends)."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    starts_np, lens_np = np.array(starts, np.int64), np.array(q_lens, np.int64)
    seq_lens = starts_np + lens_np
    per_req = -(-seq_lens // block_size)
    num_blocks = int(per_req.sum()) + spare_blocks
    tables = np.zeros((len(starts), int(per_req.max())), np.int64)
    if layout == "appended":
        runs = np.concatenate(([0], np.cumsum(per_req - 1)))
        for i, n in enumerate(per_req):
            tables[i, :n - 1] = np.arange(runs[i], runs[i] + n - 1)
            tables[i, n - 1] = runs[-1] + i
    else:
        order = {"shuffled": rng.permutation(num_blocks), "in order": np.arange(num_blocks)}[layout]
        used = 0
        for i, n in enumerate(per_req):
            tables[i, :n] = order[used:used + n]
            used += n
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    qsl = np.concatenate(([0], np.cumsum(lens_np)))
    n_rows = int(qsl[-1])
    positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts_np, lens_np, strict=True)])
    row_req = np.repeat(np.arange(len(starts)), lens_np)
    slots = tables[row_req, positions // block_size] * block_size + positions % block_size
    # q and k/v as views into one fused row, as the model produces them (strided rows)
    fused = torch.randn(n_rows, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    batch = FlatBatch(
        input_ids=torch.zeros(n_rows, dtype=torch.int64), positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slots), query_start_loc=torch.from_numpy(qsl).to(torch.int32),
        seq_lens=torch.from_numpy(seq_lens).to(torch.int32), block_tables=torch.from_numpy(tables).to(torch.int32),
        logits_indices=torch.from_numpy(qsl[1:] - 1), request_ids=tuple(f"r{i}" for i in range(len(starts))),
        sample_requests=(), query_lens_np=lens_np, starts_np=starts_np, seq_lens_np=seq_lens,
        block_tables_np=tables, block_size=block_size)
    case = Case(batch, fused[:, :heads], fused[:, heads:heads + kv_heads], fused[:, heads + kv_heads:],
                k_cache, v_cache)
    return case if torch.device(device).type == "cpu" else case.to(device)


def run_backend(backend: object, case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output and the caches after one layer's forward, on copies of the case's caches."""
    kc, vc = case.k_cache.clone(), case.v_cache.clone()
    meta = backend.prepare(case.batch)
    out = backend.forward(case.q, case.k, case.v, kc, vc, meta)
    return out, kc, vc
