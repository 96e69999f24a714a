"""The Triton store and paged-attention kernels match the SDPA backend, run by Triton's CPU interpreter.

Tolerance: fp32 outputs within 2e-5 absolute of SDPA (both accumulate in fp32; observed ~1e-6);
fp16 within 2e-3 (fp16 rounding of the output); the caches bit-identical (the store is a copy).
bf16 is left to the GPU check: Triton's interpreter mishandles bf16 loads on CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402, F401 - in the test extra: a missing Triton fails here, never skips

from itlbench.engine.attention.cases import make_case, run_backend  # noqa: E402
from itlbench.engine.attention.sdpa import SdpaBackend  # noqa: E402
from itlbench.engine.attention.triton_backend import TritonBackend  # noqa: E402

torch.set_num_threads(1)
CPU = torch.device("cpu")
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}

# (starts, query lengths): cached tokens before the step and new tokens in it, per request
DECODE = ([6, 15, 16, 40, 0], [1, 1, 1, 1, 1])  # ragged contexts, partial and exactly full blocks
PREFILL = ([0, 0], [9, 33])  # fresh prompts, one spanning three blocks of 16
EXTEND = ([16, 5], [7, 20])  # chunks after a cached prefix, aligned and unaligned
MIXED = ([0, 31, 12, 3, 47], [18, 1, 5, 1, 1])  # prefill, decodes and a chunk in one step


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
@pytest.mark.parametrize("shape", [DECODE, PREFILL, EXTEND, MIXED], ids=["decode", "prefill", "extend", "mixed"])
def test_triton_matches_sdpa(shape: tuple[list[int], list[int]], heads: int, kv_heads: int, block_size: int) -> None:
    case = make_case(*shape, heads=heads, kv_heads=kv_heads, head_dim=32, block_size=block_size)
    ref, ref_k, ref_v = run_backend(SdpaBackend(CPU), case)
    out, k_cache, v_cache = run_backend(TritonBackend(CPU), case)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=0)


@pytest.mark.parametrize("head_dim", [24, 64])  # a head dim that is not a power of two pads to 32
def test_head_dims_and_fp16(head_dim: int) -> None:
    case = make_case(*MIXED, heads=8, kv_heads=2, head_dim=head_dim, block_size=16, dtype=torch.float16, seed=3)
    ref, ref_k, _ = run_backend(SdpaBackend(CPU), case)
    out, k_cache, _ = run_backend(TritonBackend(CPU), case)
    assert out.dtype == torch.float16 and torch.equal(k_cache, ref_k)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[torch.float16], rtol=0)


def test_long_context_spans_many_key_tiles() -> None:
    """A context of several 64-key tiles with a ragged tail, decode and a chunk after it."""
    case = make_case([150, 130], [1, 20], heads=4, kv_heads=1, head_dim=16, block_size=16, seed=5)
    ref, _, _ = run_backend(SdpaBackend(CPU), case)
    out, _, _ = run_backend(TritonBackend(CPU), case)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=0)


@pytest.mark.parametrize("splits", [2, 3, 16])
def test_split_keys_decode_matches_sdpa(splits: int) -> None:
    """Flash-decoding: each context split over programs, partial results combined; more splits than
    key tiles leaves some empty."""
    from itlbench.engine.attention.triton_kernels import decode_splits, paged_attention

    case = make_case([150, 3, 64, 0, 200], [1] * 5, heads=8, kv_heads=2, head_dim=32, block_size=16, seed=11)
    ref, k_cache, v_cache = run_backend(SdpaBackend(CPU), case)
    b = case.batch
    out = paged_attention(case.q, k_cache, v_cache, b.block_tables, b.query_start_loc, b.seq_lens, 1,
                          num_splits=splits)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=0)
    assert decode_splits(1, 8, 132) == 16 and decode_splits(32, 8, 132) == 2 and decode_splits(64, 8, 132) == 1


def test_store_writes_its_slots_only_and_skips_negative() -> None:
    from itlbench.engine.attention.triton_kernels import store_kv

    case = make_case(*EXTEND, heads=4, kv_heads=2, head_dim=32, block_size=16, seed=7)
    kc, vc = case.k_cache.clone(), case.v_cache.clone()
    slots = case.batch.slot_mapping.clone()
    slots[::3] = -1  # these rows write nothing
    store_kv(case.k, case.v, kc, vc, slots)
    flat_k, flat_v = kc.view(-1, 2, 32), vc.view(-1, 2, 32)
    want_k, want_v = case.k_cache.clone().view(-1, 2, 32), case.v_cache.clone().view(-1, 2, 32)
    keep = slots >= 0
    want_k[slots[keep]] = case.k[keep]
    want_v[slots[keep]] = case.v[keep]
    assert torch.equal(flat_k, want_k) and torch.equal(flat_v, want_v)
