"""The native CPU decode kernel computes what gathered, padded SDPA computes, in mixed batches too."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from itlbench.core.engine import Engine
from itlbench.engine.attention.cases import make_case, run_backend
from itlbench.engine.attention.sdpa import SdpaBackend
from itlbench.engine.cpu import native
from itlbench.engine.cpu.build import BuildError, build_library, cache_dir
from itlbench.system.cache import CACHE_ENV
from tests.support.native import native_library, tiny_greedy

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kernel() -> native.PagedDecodeKernel:
    return native_library()


CASES = [
    # heads, kv_heads, dim, block, starts, q_lens: decode rows of every length class, with prefill beside
    (4, 1, 32, 16, [0, 14, 15, 16, 40, 299, 1000], [1, 1, 1, 1, 1, 1, 1]),
    (4, 2, 16, 16, [5, 0, 33, 70], [1, 20, 1, 1]),  # a fresh prefill among decodes
    (6, 2, 24, 16, [3, 64, 17, 0], [1, 1, 9, 1]),  # head dim not a multiple of 16: the scalar path
    (8, 8, 64, 32, [100, 31, 0], [1, 1, 1]),  # no grouping, wider blocks
    (8, 2, 32, 8, [7, 500], [1, 1]),  # blocks narrower than a vector
    # every (group, head dim) the kernel compiles as constants (SHAPES in paged_decode.c)
    (8, 2, 64, 16, [0, 300, 17], [1, 1, 1]),
    (8, 2, 128, 16, [5, 129, 0], [1, 1, 1]),
    (16, 2, 128, 16, [40, 1], [1, 1]),
    (4, 2, 32, 16, [60, 3], [1, 1]),
    (34, 2, 32, 16, [60, 3], [1, 1]),  # a group wider than the vector path takes (MAX_G): the scalar path
]


LAYOUTS = ["shuffled", "in order", "appended"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block", "starts", "q_lens"), CASES)
def test_native_decode_matches_gathered_sdpa(kernel, threads, heads, kv_heads, dim, block, starts, q_lens,
                                             layout) -> None:
    """Shuffled: the two passes with prefetching; in order: one pass (online softmax); appended: one
    pass with prefetching where a long sequence's last block jumps, two where a short one's does."""
    check_against_sdpa(kernel, threads, heads, kv_heads, dim, block, starts, q_lens, layout)


# Narrower vector widths than this machine's own: 8 lanes (AVX2) and 4 (SSE2, the x86-64 baseline).
NARROWER = {"haswell": "avx2", "x86-64": "sse2"}


def _cannot_run(arch: str) -> str | None:
    if platform.machine() not in ("x86_64", "AMD64"):
        return "x86 targets"
    if NARROWER[arch] not in open("/proc/cpuinfo").read():
        return f"this CPU cannot run {arch} code"
    return None


def _variants(arch: str) -> list[list[str]]:
    return [[f"-march={arch}", "-fopenmp"]]


@pytest.fixture(scope="module", autouse=True)
def narrower_builds() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """native.build of every narrower target, started with the module so the compiles (about 25 s and 13 s of one
    core each) overlap the tests before theirs and each other: a compile holds its cache's lock, so two in one
    cache take turns; each here runs in a process and a cache of its own (kept beside the default one, so a
    second session finds it built). Each prints the library's path."""
    procs = {}
    try:
        root = cache_dir()
    except BuildError:  # no cache to build in: the test says why (native.build's own answer)
        root = None
    for arch in NARROWER:
        if _cannot_run(arch) is None and root is not None:
            code = (f"from itlbench.engine.cpu import native\nk, why = native.build({arch!r}, {_variants(arch)!r})\n"
                    "print(k.path if k else '')")
            env = {**os.environ, CACHE_ENV: str(root / f"narrower-{arch}"), "PYTHONPATH": str(ROOT)}
            procs[arch] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("arch", list(NARROWER))
def test_narrower_vector_builds_match_too(kernel, narrower_builds, arch) -> None:
    if (why := _cannot_run(arch)) is not None:
        pytest.skip(why)
    out, _ = narrower_builds[arch].communicate(timeout=300) if arch in narrower_builds else ("", "")
    if out.strip():  # copied in where native.build looks (test_panel_gemm loads the same build from there)
        built = Path(out.strip())
        build_library(cache_dir() / "kernels" / built.name, lambda tmp: ["cp", str(built), tmp])
    narrow, why = native.build(arch, _variants(arch))
    assert narrow is not None, why
    for case in CASES:
        for layout in LAYOUTS:
            check_against_sdpa(narrow, 2, *case, layout)


def check_against_sdpa(kernel, threads, heads, kv_heads, dim, block, starts, q_lens, layout="shuffled") -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = make_case(starts, q_lens, heads, kv_heads, dim, block, layout=layout)
        fast, reference = SdpaBackend(CPU), SdpaBackend(CPU, use_native=False)
        fast.kernel = kernel
        assert fast.decode_kernel == "native" and reference.decode_kernel == "sdpa"
        meta = fast.prepare(case.batch)
        assert meta.native is not None and not meta.single
        out, kc, vc = run_backend(fast, case)
        ref, ref_k, ref_v = run_backend(reference, case)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_bfloat16_falls_back_to_padded_sdpa(kernel) -> None:
    half = make_case([9, 40, 0], [1, 1, 5], 4, 1, 32, 16).to(CPU, torch.bfloat16)
    out, _, _ = run_backend(SdpaBackend(CPU), half)
    ref, _, _ = run_backend(SdpaBackend(CPU, use_native=False), half)
    assert torch.equal(out, ref)


def test_engine_greedy_same_with_and_without_the_kernel(kernel) -> None:
    def gathered_sdpa(engine: Engine) -> None:
        assert engine.runner.backend.decode_kernel == "native"
        engine.runner.backend.kernel = None
        assert engine.runner.backend.decode_kernel == "sdpa"

    assert tiny_greedy(3) == tiny_greedy(3, gathered_sdpa)


@pytest.mark.parametrize(("heads", "kv_heads", "prefix", "rows"), [(4, 1, 300, 37), (4, 2, 16, 16), (6, 2, 1, 50)])
def test_extend_chunk_split_by_log_sum_exp_matches_masked_sdpa(heads, kv_heads, prefix, rows) -> None:
    from itlbench.engine.attention import sdpa

    if sdpa._FLASH_LSE is None:
        pytest.skip("this torch has no CPU flash attention with log-sum-exp")
    gen = torch.Generator().manual_seed(heads + prefix)
    dim, total = 32, prefix + rows
    q = torch.randn(rows, heads, dim, generator=gen)
    k, v = torch.randn(total, kv_heads, dim, generator=gen), torch.randn(total, kv_heads, dim, generator=gen)
    mask = torch.arange(total)[None, :] <= torch.arange(prefix, total)[:, None]
    masked = sdpa._sdpa(q, k, v, mask=mask)
    split = sdpa._extend_split(q, k[prefix:], v[prefix:], k[:prefix], v[:prefix])
    torch.testing.assert_close(split, masked, atol=2e-5, rtol=1e-4)
