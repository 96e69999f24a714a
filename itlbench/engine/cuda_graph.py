"""CUDA graphs for decode-only steps: one graph per bucketed batch size, replayed over fixed buffers.

A decode step launches a few hundred small kernels whose launch cost, not HBM, dominates a small
batch on a fast GPU. A graph captured once per batch-size bucket replays them in one launch.

Only steps whose chunks are all one token long qualify (the shapes then depend on the number of
requests alone); prefill and mixed steps stay eager. A batch of `n` requests runs in the smallest
bucket `B >= n`: rows `n..B-1` are padding that reads and writes only a scratch block, one block past
the ones the block manager hands out (slot `scratch_block * block_size`, context length 1), so
padding never touches a request's KV. Attention metadata comes from the backend's
`decode_metadata` over the same fixed buffers, so nothing in the replayed forward reads the host.

`DecodeGraphs(capture=False)` runs the same fixed-buffer path eagerly: how CPU tests check the
padding without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from itlbench.engine.batch import FlatBatch


def graph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (which is always a bucket)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8))
    sizes.append(max_num_seqs)
    return tuple(sorted(set(sizes)))


def bucket_for(num_reqs: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds `num_reqs` rows, or None (the step runs eager)."""
    for b in buckets:
        if b >= num_reqs:
            return b
    return None


def is_uniform_decode(batch: FlatBatch) -> bool:
    """Every chunk is one token: the step's shapes depend on the number of requests alone."""
    return batch.num_tokens == batch.num_reqs


ForwardFn = Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]


class DecodeGraphs:
    """Fixed decode buffers for up to `max(buckets)` requests and, with `capture`, one graph per bucket.

    `forward(input_ids, positions, meta) -> logits [rows, vocab]` is the model from embedding to
    logits; `backend.decode_metadata(slot_mapping, query_start_loc, seq_lens, block_tables)` wraps
    the fixed buffers in the backend's metadata.
    """

    def __init__(self, forward: ForwardFn, backend: object, buckets: tuple[int, ...], max_blocks_per_seq: int,
                 scratch_block: int, block_size: int, device: torch.device, capture: bool = True) -> None:
        self.forward, self.backend, self.buckets = forward, backend, tuple(sorted(buckets))
        self.scratch_block, self.block_size, self.device = scratch_block, block_size, device
        rows = self.buckets[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), scratch_block * block_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.full((rows, max_blocks_per_seq), scratch_block, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def supports(self, batch: FlatBatch) -> bool:
        return is_uniform_decode(batch) and batch.num_reqs <= self.max_batch \
            and batch.block_tables_np.shape[1] <= self.block_tables.shape[1]

    def _run(self, bucket: int) -> torch.Tensor:
        meta = self.backend.decode_metadata(self.slot_mapping[:bucket], self.query_start_loc[: bucket + 1],
                                            self.seq_lens[:bucket], self.block_tables[:bucket])
        return self.forward(self.input_ids[:bucket], self.positions[:bucket], meta)

    def _capture_all(self) -> None:
        """Largest bucket first so the smaller graphs reuse its memory pool. Buffers hold padding
        (scratch slots) while capturing, so warm-up runs write nowhere real."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bucket in reversed(self.buckets):
                self._run(bucket)  # compiles Triton kernels, picks cuBLAS algorithms
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        for bucket in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = self._run(bucket)
            self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)

    def load(self, batch: FlatBatch) -> int:
        """Copy the batch, padded to its bucket, into the fixed buffers; returns the bucket."""
        n = batch.num_reqs
        bucket = bucket_for(n, self.buckets)
        if bucket is None or not is_uniform_decode(batch):
            raise ValueError("not a decode step that fits a bucket")
        width = batch.block_tables.shape[1]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)
        self.block_tables[:n, :width].copy_(batch.block_tables, non_blocking=True)
        if bucket > n:  # padding rows: scratch block only (earlier steps may have left real rows here)
            self.input_ids[n:bucket].zero_()
            self.positions[n:bucket].zero_()
            self.slot_mapping[n:bucket].fill_(self.scratch_block * self.block_size)
            self.seq_lens[n:bucket].fill_(1)
            self.block_tables[n:bucket].fill_(self.scratch_block)
        return bucket

    def run(self, batch: FlatBatch) -> torch.Tensor:
        """Logits [num_reqs, vocab]: replayed where captured, else the same path eagerly."""
        bucket = self.load(batch)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            out = self.outputs[bucket]
        else:
            out = self._run(bucket)
        return out[: batch.num_reqs]
