"""Projection weights laid out once on CPU, so each step's products stream them as laid out.

`F.linear(x, W)` hands MKL a row-major [out, in] weight and a few rows of x; for a decode step MKL
spends most of the call re-packing W (its `sgemm_scopy` was busier than its multiply kernel in a
profile of a cpu-small step). Three layouts avoid that, in order of preference:

- **panels** (the native library builds, fp32): W re-laid once into column panels for
  `attention/panel_gemm.c`, which streams each panel once per product. Measured on a 2-core AMD EPYC
  box, 32 rows, two threads, hot/after a 64 MiB cache flush: 1536x256 122/145 µs (oneDNN 143/192,
  MKL 248/379), the 8192x256 head 695/726 µs (oneDNN 734/794); in a batch-32 x 512 cpu-small step,
  alternating steps in one process, 5.9 vs 6.9 ms. Used at every row count: prefill-sized products
  beat MKL too (2,048 rows of 1536x256, one thread: 15.6 vs 20.7 ms; two threads: 7.8 vs 9.8 ms).
- **onednn** (no native library): oneDNN re-lays W into its blocked layout
  (`mkldnn._reorder_linear_weight`) and `mkldnn._linear_pointwise` multiplies by it. Each call costs
  a fixed ~12 µs here, more than a small product takes through MKL, so weights under
  PACK_MIN_ELEMENTS stay row-major. oneDNN also keeps, for every (weight shape, row count) it has
  multiplied, a cached primitive holding memory about the size of that product's output, and does not
  give it back (torch 2.13): prefill chunks of every length grew a serving engine's RSS from 0.9 to
  2.1 GB over a ten-minute soak. Packed products are therefore limited to decode-sized row counts, at
  most `max_rows` (all of them together pin at most PACKED_CACHE_BYTES).
- **column-major** (neither): `W.t()` contiguous, which MKL streams without re-packing.

The packed copy rides on the parameter as an attribute and `project` uses it when present; the
parameter keeps its values (the embedding, the export path, prefill-sized products and the weight
counts read them), so packing costs a second copy of the projection weights in memory.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PACKED = "cpu_packed"  # attribute name of a parameter's PackedWeight
PACK_MIN_ELEMENTS = 65_536  # smaller weights multiply faster unpacked (see above)
PACKED_CACHE_BYTES = 128 << 20  # what oneDNN's cached primitives may pin, all packed weights together
PACKED_MAX_ROWS = 64  # and never more rows than a large decode batch


@dataclass(frozen=True)
class PackedWeight:
    tensor: torch.Tensor  # the re-laid copy (panels or oneDNN's blocked layout)
    max_rows: int  # products with more rows go through F.linear (see above)
    multiply: Callable[[torch.Tensor, PackedWeight], torch.Tensor]  # x -> x @ W.t() from `tensor`
    out_features: int


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.t(), through the weight's packed copy when it has one and serves x's row count
    (panels: every count; oneDNN: decode-sized ones)."""
    packed = getattr(weight, PACKED, None)
    if packed is None or x.shape[0] > packed.max_rows:
        return F.linear(x, weight)
    return packed.multiply(x, packed)


def _onednn_multiply(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, None, "none", [], "")


class PanelGemm:
    """`itl_gemm_f32` (attention/panel_gemm.c) bound, with the packing its panels need."""

    def __init__(self, lib: ctypes.CDLL, threads: bool) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._gemm = lib.itl_gemm_f32
        self._gemm.argtypes = [p, i, p, p, i, i, i, i, i]
        self._gemm.restype = None
        lib.itl_gemm_panel_width.restype = i
        self.width = int(lib.itl_gemm_panel_width())
        self._threads = threads

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[N, K] -> [ceil(N / width), K, width], zero-padded past column N."""
        n, k = weight.shape
        panels = -(-n // self.width)
        padded = F.pad(weight.detach(), (0, 0, 0, panels * self.width - n))
        return padded.view(panels, self.width, k).transpose(1, 2).contiguous()

    def __call__(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
        if x.dtype != torch.float32 or x.stride(-1) != 1 or x.dim() != 2:
            x = x.float().contiguous().view(-1, x.shape[-1])
        out = x.new_empty(x.shape[0], packed.out_features)
        self._gemm(x.data_ptr(), x.stride(0), packed.tensor.data_ptr(), out.data_ptr(), out.stride(0), x.shape[0],
                   packed.out_features, x.shape[1], torch.get_num_threads() if self._threads else 1)
        return out


def panel_gemm() -> PanelGemm | None:
    """The panel product from the native library, or None where it does not build."""
    from itlbench.engine.cpu import native

    kernel = native.load()
    return None if kernel is None else PanelGemm(kernel.lib, kernel.openmp)


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


def pack_projections(model: nn.Module, gemm: PanelGemm | None = None) -> str:
    """Lay every projection out for the best product this machine has (see above). Returns the
    layout: "panels"; "onednn" (some packed, the small ones row-major); "row-major" (all too small
    for oneDNN); or "column-major"."""
    weights = projection_weights(model)
    if not weights:
        return "row-major"
    first = weights[0][1]
    if gemm is not None and first.dtype == torch.float32 and first.device.type == "cpu":
        with torch.no_grad():
            for _, p in weights:
                setattr(p, PACKED, PackedWeight(gemm.pack(p), sys.maxsize, gemm, p.shape[0]))
        return "panels"
    if _onednn_packs(first):
        large = [p for _, p in weights if p.numel() >= PACK_MIN_ELEMENTS]
        max_rows = packed_max_rows({tuple(p.shape) for p in large}, first.element_size())
        with torch.no_grad():
            for p in large:
                blocked = torch.ops.mkldnn._reorder_linear_weight(p.detach())
                setattr(p, PACKED, PackedWeight(blocked, max_rows, _onednn_multiply, p.shape[0]))
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
