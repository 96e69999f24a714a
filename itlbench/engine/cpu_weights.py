"""Projection weights packed once for oneDNN on CPU, so each step's products stream them as laid out.

`F.linear(x, W)` hands MKL a row-major [out, in] weight and a few rows of x; for a decode step MKL
spends most of the call re-reading W in the order its kernel wants. oneDNN can reorder W once, at
load, into its own blocked layout (`mkldnn._reorder_linear_weight`), and `mkldnn._linear_pointwise`
then multiplies by that packed copy. Measured on a 2-core AMD EPYC box, one thread, all 25 products
of a cpu-small step: 1.8 vs 4.6 ms at 8 rows, 4.7 vs 7.3 ms at 32 (263 vs 307 ms at 2,048 rows, but
see below: prefill-sized products are not packed).

Each oneDNN call also costs a fixed ~12 µs here, more than a small product takes through MKL: a
192x256 weight took 5 vs 17 µs at 1 row, 26 vs 34 µs at 32 rows. Weights under PACK_MIN_ELEMENTS
therefore stay as they are and go through `F.linear`; in cpu-small that is QKV and the output
projection, while gate+up, down and the LM head are packed.

oneDNN keeps, for every (weight shape, row count) it has multiplied, a cached primitive holding
memory about the size of that product's output, and does not give it back (torch 2.13): prefill
chunks of every length grew a serving engine's RSS from 0.9 to 2.1 GB over a ten-minute soak. Packed products are therefore limited to the row
counts of decode steps, at most `max_rows` (chosen so that all of them together pin at most
PACKED_CACHE_BYTES), and larger products go through `F.linear`, which caches nothing.

The packed copy rides on the parameter as an attribute and `project` uses it when present; the
parameter keeps its values (the embedding, the export path and the weight counts read them), so
packing costs a second copy of the projection weights in memory. Without oneDNN, or for a dtype it
will not pack, the weights are re-laid column-major instead, which streams `W.t()` contiguously.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PACKED = "onednn_packed"  # attribute name of a parameter's PackedWeight
PACK_MIN_ELEMENTS = 65_536  # smaller weights multiply faster unpacked (see above)
PACKED_CACHE_BYTES = 128 << 20  # what oneDNN's cached primitives may pin, all packed weights together
PACKED_MAX_ROWS = 64  # and never more rows than a large decode batch


@dataclass(frozen=True)
class PackedWeight:
    tensor: torch.Tensor  # oneDNN's blocked copy
    max_rows: int  # products with more rows go through F.linear (see above)


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.t(), through the weight's oneDNN-packed copy when it has one and x is a decode-sized
    batch of rows."""
    packed = getattr(weight, PACKED, None)
    if packed is None or x.shape[0] > packed.max_rows:
        return F.linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, None, "none", [], "")


def packed_max_rows(shapes: set[tuple[int, int]], dtype_bytes: int) -> int:
    """The most rows that keep oneDNN's cache within PACKED_CACHE_BYTES. Primitives are cached by
    shape, so layers alike share them: one cached output of r rows per weight shape, for every r up
    to the cap, pins about cap * (cap + 1) / 2 * sum(out) * dtype_bytes."""
    per_row = max(1, sum(out for out, _ in shapes) * dtype_bytes)
    cap = min(PACKED_MAX_ROWS, math.isqrt(2 * PACKED_CACHE_BYTES // per_row))
    while cap > 1 and cap * (cap + 1) // 2 * per_row > PACKED_CACHE_BYTES:
        cap -= 1
    return max(1, cap)


def projection_weights(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every 2-D weight used as a product: all but the embedding table, unless it is also the LM head."""
    tied = getattr(model, "lm_head", "untied") is None
    return [(name, p) for name, p in model.named_parameters()
            if p.dim() == 2 and (tied or not name.endswith("embed_tokens"))]


def pack_projections(model: nn.Module) -> str:
    """Pack every projection of at least PACK_MIN_ELEMENTS for oneDNN, or lay all of them out
    column-major where oneDNN cannot. Returns the layout: "onednn" (some packed, the small ones
    row-major), "row-major" (all too small to pack) or "column-major"."""
    weights = projection_weights(model)
    if weights and _onednn_packs(weights[0][1]):
        large = [p for _, p in weights if p.numel() >= PACK_MIN_ELEMENTS]
        max_rows = packed_max_rows({tuple(p.shape) for p in large}, weights[0][1].element_size())
        with torch.no_grad():
            for p in large:
                setattr(p, PACKED, PackedWeight(torch.ops.mkldnn._reorder_linear_weight(p.detach()), max_rows))
        return "onednn" if large else "row-major"
    column_major_projections(model)
    return "column-major"


def _onednn_packs(weight: torch.Tensor) -> bool:
    """oneDNN is built in, and packs and multiplies this weight's dtype: tried on a slice of it."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(weight.detach()[:8].contiguous())
        torch.ops.mkldnn._linear_pointwise(weight.new_ones(2, weight.shape[1]), probe, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


def column_major_projections(model: nn.Module) -> int:
    """Re-lay every projection weight column-major (values and shapes unchanged); returns how many."""
    n = 0
    with torch.no_grad():
        for name, p in projection_weights(model):
            if name.endswith("embed_tokens"):
                continue  # indexed by row
            p.data = p.data.t().contiguous().t()
            n += 1
    return n
