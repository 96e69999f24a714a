"""Flatten a `SchedulerOutput` into one `[N]` row batch plus the offsets attention needs.

Every operator but attention is row-wise, so all scheduled tokens of all requests become one
matrix; `query_start_loc` and `seq_lens` tell attention where each request's rows start and how
long its context is. Built with numpy (O(requests) Python, O(tokens) vectorised), converted to
torch in one place. A step of decode rows only (most steps) is built from Python lists in one pass
instead: there every numpy call's fixed cost, paid on caches the forward has just flushed, was most
of the work (0.32 ms of a batch-32 step for what takes 0.1 ms on warm caches).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from itlbench.core.request import Request
from itlbench.core.scheduler_output import SchedulerOutput


@dataclass
class FlatBatch:
    """One step's model input. Index `i` of the per-chunk arrays is the i-th scheduled chunk."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64: block_id * block_size + offset of each row's K/V
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32: context length after this step (prefix + new rows)
    block_tables: torch.Tensor  # [R, max_blocks] int32, padded with 0 (on CPU, a view of block_tables_np)
    logits_indices: torch.Tensor  # [S] int64: last row of every chunk that samples
    request_ids: tuple[str, ...]  # [R]
    sample_requests: tuple[Request, ...]  # [S]: whose token each logits row yields
    # host copies for metadata built on the CPU
    query_lens_np: np.ndarray
    starts_np: np.ndarray
    seq_lens_np: np.ndarray
    block_tables_np: np.ndarray
    block_size: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_reqs(self) -> int:
        return len(self.request_ids)


def _chunk_tokens(req: Request, start: int, end: int) -> list[int]:
    if end - start == 1:
        return [req.token_at(start)]
    return req.token_slice(start, end)


def flatten(output: SchedulerOutput, block_size: int, device: torch.device | str = "cpu") -> FlatBatch:
    chunks = output.chunks
    if chunks and all(c.num_new_tokens == 1 for c in chunks):
        return _flatten_decode(chunks, block_size, device)
    starts = np.fromiter((c.start for c in chunks), np.int64, len(chunks))
    lens = np.fromiter((c.num_new_tokens for c in chunks), np.int64, len(chunks))
    seq_lens = starts + lens
    total = int(lens.sum())
    qsl = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum(lens, out=qsl[1:])
    # one pass over Python ints: a numpy conversion per chunk cost more than the rest together
    input_ids = np.fromiter(chain.from_iterable(_chunk_tokens(c.request, c.start, c.end) for c in chunks),
                            np.int64, total)
    row_req = np.repeat(np.arange(len(chunks)), lens)
    positions = np.arange(total, dtype=np.int64) - np.repeat(qsl[:-1] - starts, lens)

    num_blocks = -(-seq_lens // block_size)
    block_tables = np.zeros((len(chunks), int(num_blocks.max(initial=1))), np.int32)
    counts = num_blocks.tolist()
    used = np.fromiter(chain.from_iterable(c.request.block_ids[:n] for c, n in zip(chunks, counts, strict=True)),
                       np.int32, int(num_blocks.sum()))
    block_tables[np.arange(block_tables.shape[1]) < num_blocks[:, None]] = used
    slot_mapping = block_tables[row_req, positions // block_size].astype(np.int64) * block_size + positions % block_size

    samples = np.fromiter((c.samples for c in chunks), bool, len(chunks))
    logits_indices = qsl[1:][samples] - 1

    def t(a: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype)

    return FlatBatch(
        input_ids=t(input_ids), positions=t(positions), slot_mapping=t(slot_mapping),
        query_start_loc=t(qsl, torch.int32), seq_lens=t(seq_lens, torch.int32),
        block_tables=t(block_tables, torch.int32), logits_indices=t(logits_indices),
        request_ids=tuple(c.request.request_id for c in chunks),
        sample_requests=tuple(c.request for c, s in zip(chunks, samples, strict=True) if s),
        query_lens_np=lens, starts_np=starts, seq_lens_np=seq_lens, block_tables_np=block_tables,
        block_size=block_size,
    )


def _flatten_decode(chunks: list, block_size: int, device: torch.device | str) -> FlatBatch:
    """Row i is chunk i's one token at its start position. The same arrays as the general path, from
    Python lists, in three numpy arrays and three torch views of them (each torch call costs ~20 µs
    on cold caches); a row samples when it computes its request's last known token (a one-token
    prefill chunk short of the prompt's end does not)."""
    n = len(chunks)
    reqs = [c.request for c in chunks]
    positions = [c.start for c in chunks]
    tables = [r.block_ids for r in reqs]
    counts = [p // block_size + 1 for p in positions]  # blocks holding positions 0..p
    width = max(counts)
    pad = [0] * width
    block_tables = np.fromiter(chain.from_iterable(t[:k] + pad[k:] for t, k in zip(tables, counts, strict=True)),
                               np.int32, n * width).reshape(n, width)
    rows = list(range(n))
    longs = np.array([[r.token_at(p) for r, p in zip(reqs, positions, strict=True)], positions,
                      [t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions, strict=True)],
                      rows, [p + 1 for p in positions]], np.int64)  # ids, positions, slots, rows, seq_lens
    ints = np.array([*rows, n, *(p + 1 for p in positions)], np.int32)  # query_start_loc, seq_lens
    samples = [p + 1 == r.num_tokens for r, p in zip(reqs, positions, strict=True)]
    on_cpu = torch.device(device).type == "cpu"
    longs_t, ints_t, tables_t = (torch.from_numpy(a) if on_cpu else torch.from_numpy(a).to(device)
                                 for a in (longs, ints, block_tables))
    input_ids, positions_t, slot_mapping, row_index, _ = longs_t.unbind(0)
    query_start_loc, seq_lens = ints_t.split((n + 1, n))
    if all(samples):
        sample_requests, logits_indices = tuple(reqs), row_index
    else:
        sample_requests = tuple(r for r, s in zip(reqs, samples, strict=True) if s)
        logits_indices = row_index[torch.tensor(samples, device=device)]
    return FlatBatch(
        input_ids=input_ids, positions=positions_t, slot_mapping=slot_mapping, query_start_loc=query_start_loc,
        seq_lens=seq_lens, block_tables=tables_t, logits_indices=logits_indices,
        request_ids=tuple(r.request_id for r in reqs), sample_requests=sample_requests,
        query_lens_np=np.ones(n, np.int64), starts_np=longs[1], seq_lens_np=longs[4], block_tables_np=block_tables,
        block_size=block_size,
    )


class Flattener:
    """`flatten` for one engine, which keeps the last step's batch when it was decode rows only: if the
    next step decodes the same requests in the same order, one token further each, that batch's arrays
    are advanced in place (positions, slots and lengths by one, new token ids, a table entry where a
    row enters a new block) and the same batch returned, as vLLM's persistent input batch does. Every
    other step is flattened anew. CPU only: there the torch tensors are views of the numpy arrays."""

    def __init__(self, block_size: int, device: torch.device | str = "cpu") -> None:
        self.block_size, self.device = block_size, device
        self._keeps = torch.device(device).type == "cpu"
        self._last: FlatBatch | None = None
        # the last batch's arrays as `_flatten_decode` laid them out: rows ids, positions, slots, rows,
        # seq_lens (int64); and the int32 lengths attention reads
        self._longs = self._seq_lens = np.empty(0)

    def __call__(self, output: SchedulerOutput) -> FlatBatch:
        if self._last is not None and self._advance(self._last, output.chunks):
            return self._last
        batch = flatten(output, self.block_size, self.device)
        decode_rows = batch.num_tokens == batch.num_reqs == len(batch.sample_requests)
        self._last = batch if self._keeps and decode_rows else None
        if self._last is not None:  # one-row chunks only: `_flatten_decode` built it
            self._longs, self._seq_lens = batch.starts_np.base, batch.seq_lens.numpy()
        return batch

    def _advance(self, last: FlatBatch, chunks: list) -> bool:
        reqs, bs = last.sample_requests, self.block_size
        if len(chunks) != len(reqs) or any(c.request is not r for c, r in zip(chunks, reqs, strict=False)):
            return False
        longs, tables = self._longs, last.block_tables_np
        starts = [c.start for c in chunks]
        if (starts != (longs[1] + 1).tolist() or any(p + 1 != r.num_tokens for r, p in zip(reqs, starts, strict=True))
                or any(c.num_new_tokens != 1 for c in chunks)):
            return False
        edges = [i for i, p in enumerate(starts) if p % bs == 0]  # rows whose token opens a new block
        if any(starts[i] // bs >= tables.shape[1] for i in edges):
            return False  # the table must widen: flatten anew
        longs[0] = [r.token_at(p) for r, p in zip(reqs, starts, strict=True)]
        longs[1:3] += 1
        longs[4] += 1
        self._seq_lens += 1
        for i in edges:
            block = reqs[i].block_ids[starts[i] // bs]
            tables[i, starts[i] // bs] = block
            longs[2, i] = block * bs
        return True
