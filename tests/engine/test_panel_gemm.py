"""The native decode-sized product (panel_gemm.c) computes what MKL's `F.linear` computes, for every
shape its tiles and panels split unevenly, on one thread and two, strided rows, and narrower builds."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.engine.cpu import native
from itlbench.engine.cpu.weights import PackedWeight, PanelGemm
from tests.support.native import native_library


@pytest.fixture(scope="module")
def gemm() -> PanelGemm:
    kernel = native_library()
    return PanelGemm(kernel.lib, kernel.openmp)


def product(gemm: PanelGemm, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return gemm(x, PackedWeight(gemm.pack(w), 1 << 30, gemm, w.shape[0]))


def with_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 130), out=st.integers(1, 200), inner=st.integers(1, 96), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_panel_product_matches_f_linear(gemm, rows, out, inner, threads, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, inner, generator=g), torch.randn(out, inner, generator=g)
    before = with_threads(threads)
    try:
        got = product(gemm, x, w)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_decode_shapes_of_the_presets(gemm) -> None:
    """cpu-small's four projections and head at the row counts of decode and small mixed steps."""
    for out, inner in ((192, 256), (256, 128), (1536, 256), (256, 768), (8192, 256)):
        w = torch.randn(out, inner) * inner**-0.5
        for rows in (1, 6, 31, 32, 64, 256):
            x = torch.randn(rows, inner)
            torch.testing.assert_close(product(gemm, x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_strided_rows_and_padded_panels(gemm) -> None:
    """x a view with a row stride wider than its rows; N one past a panel boundary (zero padding)."""
    base = torch.randn(40, 300)
    x = base[3:40:2, 10:138]  # 19 rows of 128, row stride 600
    w = torch.randn(gemm.width + 1, 128)
    assert x.stride(0) == 600 and x.stride(1) == 1
    torch.testing.assert_close(product(gemm, x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    packed = gemm.pack(w)
    assert packed.shape == (2, 128, gemm.width)
    assert torch.count_nonzero(packed[1, :, 1:]) == 0 and torch.equal(packed[1, :, 0], w[-1])


def test_a_column_strided_or_non_fp32_input_is_made_contiguous(gemm) -> None:
    w = torch.randn(48, 64)
    x = torch.randn(64, 5).t()  # column-strided view
    torch.testing.assert_close(product(gemm, x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    xd = torch.randn(5, 64, dtype=torch.float64)
    torch.testing.assert_close(product(gemm, xd, w), F.linear(xd.float(), w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("arch,flag", [("haswell", "avx2"), ("x86-64", "sse2")])
def test_narrower_builds_match_too(arch, flag) -> None:
    """16-register targets take the 4 x 3 tile (AVX2: 8 lanes; SSE2: 4)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 targets")
    if flag not in open("/proc/cpuinfo").read():
        pytest.skip(f"this CPU cannot run {arch} code")
    narrow, why = native.build(arch, [[f"-march={arch}", "-fopenmp"]])
    assert narrow is not None, why
    gemm = PanelGemm(narrow.lib, narrow.openmp)
    assert gemm.width == {"haswell": 24, "x86-64": 12}[arch]
    for rows, out, inner in ((1, 192, 256), (7, 50, 33), (32, 1536, 256), (5, 13, 768)):
        x, w = torch.randn(rows, inner), torch.randn(out, inner)
        torch.testing.assert_close(product(gemm, x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
