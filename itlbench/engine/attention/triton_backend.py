"""Attention with the Triton kernels of `triton_kernels`: one store and one attention launch per layer.

Every step kind goes through the same kernel, and nothing in `forward` reads back to the host, so a
decode step built on fixed buffers (`decode_metadata`) can be captured in a CUDA graph.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from itlbench.engine.batch import FlatBatch


def available(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton backend can run on `device`, and why not."""
    try:
        installed = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        installed = False
    if not installed:
        return False, "triton is not installed (pip install -e '.[cuda]')"
    if device.type == "cuda":
        return True, ""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True, ""
    return False, "triton kernels need a CUDA device (or TRITON_INTERPRET=1 on CPU, for tests)"


@dataclass
class TritonMetadata:
    slot_mapping: torch.Tensor  # [N] int64; -1 writes nothing
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    block_tables: torch.Tensor  # [R, max_blocks] int32
    max_query_len: int


class TritonBackend:
    name = "triton"
    graph_capable = True

    def __init__(self, device: torch.device) -> None:
        ok, why = available(device)
        if not ok:
            raise RuntimeError(why)
        from itlbench.engine.attention import triton_kernels

        self.device = device
        self.kernels = triton_kernels
        # decode steps split each context over programs to fill the GPU (flash-decoding); the CPU
        # interpreter acts as a 4-SM device so that tests of small batches cover the split path
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count \
            if device.type == "cuda" else 4

    def prepare(self, batch: FlatBatch) -> TritonMetadata:
        return TritonMetadata(batch.slot_mapping, batch.query_start_loc, batch.seq_lens, batch.block_tables,
                              int(batch.query_lens_np.max(initial=1)))

    def decode_metadata(self, slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor) -> TritonMetadata:
        """Metadata over caller-owned buffers for a step of one-token chunks (CUDA graph capture)."""
        return TritonMetadata(slot_mapping, query_start_loc, seq_lens, block_tables, 1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TritonMetadata) -> torch.Tensor:
        self.kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        splits = 1
        if meta.max_query_len == 1:
            splits = self.kernels.decode_splits(meta.seq_lens.shape[0], k_cache.shape[2], self.num_sms)
        return self.kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                            meta.seq_lens, meta.max_query_len, num_splits=splits)
