"""The CPU decode-attention kernel (`csrc/paged_decode.c`), the fused row operators (`row_ops.c`), the
decode-sized matrix product (`panel_gemm.c`) and a decode step's whole decoder stack over them
(`decode_forward.c`), compiled at first use into one library with this
machine's GCC and loaded with ctypes (how it is built safely: build.py).

Why native: gathering paged K/V into a contiguous copy for SDPA reads the cache three times and pads
every row to its group's longest context; the kernel walks block tables in place, so decode reads
what its memory floor counts. Why at first use: `-march=native` code cannot ship in a wheel, and a
plain C file needs no torch headers, so GCC alone builds it, once per machine and source (tens of
seconds of one core: a build lock makes processes that start together share one). Cached under
`$ITLBENCH_CACHE_DIR` (default `$XDG_CACHE_HOME/itlbench` or `~/.cache/itlbench`, else a private
directory under the system's temporary one), keyed by source, flags, compiler and CPU.

Without a compiler (or with `ITLBENCH_NATIVE=0`) `load()` returns None and says why in
`unavailable_reason()`; attention then gathers and runs SDPA, which is correct, only slower, and
`fallback_warning()` says so for run.json (the runner's `RunnerInfo.warnings`).
`ITLBENCH_NATIVE_ARCH=haswell` (any `-march` value) builds for another target than this CPU's own,
for a cache directory shared by machines of different kinds.
Built with OpenMP, the library shares torch's own `libgomp` (already loaded, same soname), so its
threads are torch's intra-op threads and `torch.set_num_threads` governs both.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import sys
import threading
from pathlib import Path

import torch

from itlbench.engine.cpu.build import BuildError, Compiler, build_library, cache_dir, find_compiler

log = logging.getLogger("itlbench.engine")

CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(CSRC / name for name in ("paged_decode.c", "row_ops.c", "panel_gemm.c", "decode_forward.c"))
HEADERS = (CSRC / "fast_exp.h",)  # included by the sources: part of the cache key
_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
ARCH_ENV = "ITLBENCH_NATIVE_ARCH"  # -march value instead of "native" (e.g. haswell, x86-64)


def _variants(arch: str) -> list[list[str]]:
    """Flag sets tried in order: the first that compiles and loads wins."""
    march = [f"-march={arch}", *(_half_width_avx512_flags() if arch == "native" else [])]
    return [march + ["-fopenmp"], march + ["-fopenmp-simd"], ["-fopenmp-simd"], []]


def _half_width_avx512_flags() -> list[str]:
    """256-bit vectors on AMD family 19h (Zen 3/4): its AVX-512 splits every operation into two
    256-bit halves, so 512-bit code only adds wider reductions (see VW in paged_decode.c)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    fields = dict(line.split(":", 1) for line in info.split("\n\n", 1)[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    amd_19h = fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
    return ["-DITL_PREFER_256", "-mprefer-vector-width=256"] if amd_19h and "avx512f" in fields.get("flags", "") else []

_lock = threading.Lock()
_kernel: PagedDecodeKernel | None = None
_reason: str | None = None


class PagedDecodeKernel:
    """`itl_paged_decode_f32` with its argument types bound."""

    def __init__(self, lib: ctypes.CDLL, path: Path, flags: list[str]) -> None:
        self.lib, self.path, self.flags = lib, path, flags
        self.openmp = "-fopenmp" in flags
        fn = lib.itl_paged_decode_f32
        p, i = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [p, i, p, p, p, p, i, p, p, i, i, i, i, i, i, ctypes.c_float, p, i, i]
        fn.restype = ctypes.c_int
        self._fn = fn
        self._write_kv = lib.itl_write_kv_f32
        self._write_kv.argtypes = [p, i, p, i, p, p, p, i, i]
        self._write_kv.restype = None

    def __call__(self, q: torch.Tensor, rows: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 tables: torch.Tensor, lens: torch.Tensor, out: torch.Tensor, scale: float,
                 scratch: torch.Tensor, scratch_per_thread: int, threads: int) -> None:
        """q/out [rows, H, D] fp32 with contiguous heads; caches [blocks, BS, KVH, D] contiguous;
        tables [n, W] int32, lens [n] int32, rows [n] int64 contiguous; scratch >= threads x per-thread."""
        n, (_, heads, dim), kv_heads = lens.shape[0], q.shape, k_cache.shape[2]
        rc = self._fn(q.data_ptr(), q.stride(0), rows.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                      tables.data_ptr(), tables.stride(0), lens.data_ptr(), out.data_ptr(), out.stride(0),
                      n, heads, kv_heads, dim, k_cache.shape[1], scale, scratch.data_ptr(),
                      scratch_per_thread, threads if self.openmp else 1)
        if rc != 0:
            raise ValueError(f"paged decode scratch of {scratch_per_thread} floats is too small")


    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> bool:
        """Each row of k/v [n, KVH, D] into its cache slot, as index_copy_ would; False (nothing written)
        unless every tensor is in the kernel's layout: fp32, heads and dims contiguous, caches contiguous,
        slots int64 contiguous."""
        row = k_cache.shape[2] * k_cache.shape[3]
        if not (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype == torch.float32
                and k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == k.shape[2]
                and k_cache.is_contiguous() and v_cache.is_contiguous()
                and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()):
            return False
        self._write_kv(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                       slot_mapping.data_ptr(), k.shape[0], row)
        return True


def grown(scratch: torch.Tensor, floats: int) -> torch.Tensor:
    """`scratch` if it holds `floats`, else a new buffer with room to spare (contexts grow a token a
    step: reallocating on every step would cost more than the kernel saves)."""
    return scratch if scratch.numel() >= floats else torch.empty(int(floats * 1.25) + 1024)


def _cpu_identity() -> str:
    """What `-march=native` depends on: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _compile_argv(cc: str, all_flags: list[str], out: str) -> list[str]:
    return [cc, *all_flags, "-o", out, *map(str, SOURCES), "-lm"]


def _build(cc: Compiler, flags: list[str], key_extra: str) -> Path:
    sources = [src.read_bytes() for src in (*SOURCES, *HEADERS)]
    all_flags = _BASE_FLAGS + flags
    key = hashlib.sha256(b"\0".join([*sources, " ".join(all_flags).encode(), key_extra.encode()])).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"paged_decode-{key}.so"
    return build_library(target, functools.partial(_compile_argv, cc.path, all_flags))


def build(arch: str = "native", variants: list[list[str]] | None = None) -> tuple[PagedDecodeKernel | None, str | None]:
    """Compile (or find in the cache) and load the kernel for `-march=arch`: (kernel, None) or
    (None, why not). Tests build other targets than this CPU's own with it (`haswell`: AVX2)."""
    if not sys.platform.startswith("linux"):
        return None, f"native kernels are built on Linux only, not {sys.platform}"
    try:
        cc = find_compiler()
        cache_dir()  # a cache directory to build in, before any compile
    except BuildError as exc:
        return None, str(exc)
    extra = "\n".join([cc.version, _cpu_identity(), torch.__version__])
    errors = []
    for flags in variants if variants is not None else _variants(arch):
        try:
            path = _build(cc, flags, extra)
            return PagedDecodeKernel(ctypes.CDLL(str(path)), path, flags), None
        except OSError as exc:  # BuildError (the compiler's whole stderr), or a library that does not load
            errors.append(f"[{' '.join(flags) or 'plain'}] {exc}")
    return None, "the library did not build with " + cc.path + ":\n" + "\n".join(errors)


def _load() -> tuple[PagedDecodeKernel | None, str | None]:
    if os.environ.get("ITLBENCH_NATIVE", "1").lower() in ("0", "false", "no", "off"):
        return None, "disabled by ITLBENCH_NATIVE=0"
    return build(os.environ.get(ARCH_ENV) or "native")


def load() -> PagedDecodeKernel | None:
    """The kernel, built and loaded once per process; None when it cannot be (see unavailable_reason)."""
    global _kernel, _reason
    with _lock:
        if _kernel is None and _reason is None:
            _kernel, _reason = _load()
            if _kernel is not None:
                log.info("decode attention: native kernel %s (%s)", _kernel.path.name, " ".join(_kernel.flags))
            else:
                log.warning("decode attention: gathered SDPA, the slow path (%s)", _reason)
        return _kernel


def unavailable_reason() -> str | None:
    load()
    return _reason


def fallback_warning() -> str | None:
    """The warning a CPU engine records without the library (None with it): its timings are the
    slow path's (gathered SDPA, torch row operators and products), not what this engine can do."""
    if load() is not None:
        return None
    return ("native CPU library unavailable, so this CPU engine runs its slower torch path (gathered SDPA, "
            f"torch row ops); its timings are not the native kernels': {unavailable_reason()}")
