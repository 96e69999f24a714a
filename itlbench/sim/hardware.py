"""Accelerator profiles for the cost model: roofs, interconnect, efficiencies, overheads, and where each
figure comes from.

A `Hardware` holds what one GPU can do (datasheet roofs: dense tensor rate per dtype, memory bandwidth
and capacity, the GPU-to-GPU link a tensor-parallel all-reduce crosses) and what a serving engine reaches
on it (efficiencies, a minimum time per kernel, fixed costs per step). Two ways to turn a step into time
(`cost_model`):

- "roofline": the source documents' whole-step arithmetic, max(FLOPs / (peak·e), bytes / (bw·e)) plus
  overheads. The `-seeds` profiles (h100-seeds, ...) use it at their illustrative 40 % / 80 %, so their
  tables come out unchanged; `itlbench calibrate` profiles use it with fitted efficiencies.
- "operators": a roofline per kernel (each weight GEMM, attention, the element-wise kernels, two
  all-reduces per layer under tensor parallelism), GEMM efficiency falling at few rows, plus a fixed
  per-step cost that CUDA graphs shrink. The presets (h100, a100, ...) use it, with efficiencies fitted
  to published measurements (sim/published.py; docs/perf/sim-vs-published.md).

Torch-free on purpose: the simulator and the CLI import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from itlbench.core.engine_config import KV_CACHE_DTYPES
from itlbench.errors import ConfigError

Counting = Literal["textbook", "executed"]
COUNTINGS: tuple[str, ...] = ("textbook", "executed")
CostModelKind = Literal["roofline", "operators"]
COST_MODELS: tuple[str, ...] = ("roofline", "operators")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}

HALF_DTYPES = ("bfloat16", "float16")  # same tensor rate on every preset


def kv_dtype_bytes(kv_cache_dtype: str) -> int | None:
    """Bytes per K/V element of `--kv-cache-dtype` (None for auto: the weights' dtype)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError("kv_cache_dtype", f"unknown dtype {kv_cache_dtype!r}", f"use one of {', '.join(KV_CACHE_DTYPES)}")
    return None if kv_cache_dtype == "auto" else DTYPE_BYTES[kv_cache_dtype]


@dataclass(frozen=True)
class Hardware:
    """One accelerator's roofs, the efficiencies an engine reaches on it, and its fixed costs.

    `peak_flops` is the dense half-precision rate (float32 for a CPU; no sparsity), `peak_flops_fp8` the dense FP8 rate (0: no
    FP8 tensor cores); `mem_bw` the memory bandwidth in bytes/s; `memory_bytes` what holds weights and
    the KV cache. `link_bw` is one direction of one GPU's link to its tensor-parallel peers (bytes/s).
    `sources` says where each figure comes from, keyed by field name.
    """

    name: str
    label: str
    peak_flops: float
    mem_bw: float
    memory_bytes: float
    dtype: str = "bfloat16"
    gemm_eff: float = 0.40
    attn_eff: float = 0.40
    mem_eff: float = 0.80
    step_overhead_s: float = 0.0  # per step, eager (no CUDA graphs): launches, Python, scheduling
    prefill_overhead_s: float = 0.0  # more per step that carries prompt work (an engine's context-phase setup)
    seq_overhead_s: float = 0.0  # per sequence (chunk) in the step: per-request launches, gathers, sampling
    counting: Counting = "textbook"
    source: str = ""
    cost_model: CostModelKind = "roofline"
    peak_flops_fp8: float = 0.0
    fp8_gemm_eff: float = 0.0  # 0: gemm_eff
    gemm_m_half: float = 0.0  # rows at which a GEMM reaches half its large-M efficiency (operators)
    attn_mem_eff: float = 0.0  # share of bandwidth attention reaches reading K/V (0: mem_eff)
    gqa_kv_reread: float = 0.0  # share of a GQA group's repeated K/V reads that reach HBM (0: read once per group)
    kernel_s: float = 0.0  # least time of one kernel (operators)
    roof_blend: float = 0.0  # GEMM time = p-norm of its two roofs with this p (0: their max) (operators)
    gemm_tile_rows: int = 0  # a 16-bit GEMM of more rows computes them rounded up to this tile (0: no rounding) (operators)
    gemm_cluster_rows: int = 0  # past this many rows, rounded up to a multiple of it instead (0: the tile throughout) (operators)
    gemm_slow_rows: tuple[int, int, float] = (0, 0, 1.0)  # (lo, hi, x): 16-bit GEMMs of lo..hi rows compute x times as long
    graph_overhead_s: float | None = None  # per decode-only step replayed as a CUDA graph (None: step_overhead_s)
    interconnect: str = ""
    link_bw: float = 0.0
    link_latency_s: float = 0.0
    link_eff: float = 1.0
    allreduce_in_switch: bool = False  # the switch reduces (NVLink SHARP): each GPU sends and receives the message once
    sources: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "mem_bw", "memory_bytes", "gemm_eff", "attn_eff", "mem_eff", "link_eff"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"gpu.{name}", f"must be a positive number, got {value!r}")
        for name in ("step_overhead_s", "seq_overhead_s", "peak_flops_fp8", "fp8_gemm_eff", "gemm_m_half",
                     "attn_mem_eff", "gqa_kv_reread", "kernel_s", "roof_blend", "link_bw", "link_latency_s",
                     "prefill_overhead_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0):
                raise ConfigError(f"gpu.{name}", f"must be >= 0, got {value!r}")
        for name in ("gemm_tile_rows", "gemm_cluster_rows"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ConfigError(f"gpu.{name}", f"must be a whole number >= 0, got {value!r}")
        try:
            lo, hi, slow = self.gemm_slow_rows
            ok = 0 <= lo <= hi and slow >= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError("gpu.gemm_slow_rows", f"must be [lo, hi, x] with 0 <= lo <= hi and x >= 1, got "
                              f"{self.gemm_slow_rows!r}")
        object.__setattr__(self, "gemm_slow_rows", (int(lo), int(hi), float(slow)))  # a JSON profile's list
        if self.graph_overhead_s is not None and not self.graph_overhead_s >= 0:
            raise ConfigError("gpu.graph_overhead_s", f"must be >= 0 or null, got {self.graph_overhead_s!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError("gpu.dtype", f"unknown dtype {self.dtype!r}", f"use one of {', '.join(DTYPE_BYTES)}")
        if self.counting not in COUNTINGS:
            raise ConfigError("gpu.counting", f"unknown counting {self.counting!r}", "use textbook or executed")
        if self.cost_model not in COST_MODELS:
            raise ConfigError("gpu.cost_model", f"unknown cost model {self.cost_model!r}", "use roofline or operators")

    @property
    def ridge(self) -> float:
        """FLOP per byte where the GEMMs' compute roof meets the bandwidth roof (π / β; FP8's π under fp8)."""
        return self.gemm_peak / self.mem_bw

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gemm_peak(self) -> float:
        """The weight GEMMs' dense rate: FP8's when serving fp8 (attention stays at the half rate)."""
        return self.peak_flops_fp8 if self.dtype == "fp8" else self.peak_flops

    @property
    def gemm_efficiency(self) -> float:
        return (self.fp8_gemm_eff or self.gemm_eff) if self.dtype == "fp8" else self.gemm_eff

    @property
    def gemm_tile(self) -> int:
        """Rows a GEMM's compute is rounded up to a multiple of: the 16-bit tile (`gemm_tile_rows`); 0 under
        fp8, whose kernels no profile here measures rounding for (docs/perf/sim-vs-published.md)."""
        return 0 if self.dtype == "fp8" else self.gemm_tile_rows

    def gemm_rows_computed(self, rows: int) -> int:
        """Rows a 16-bit GEMM of `rows` rows computes: past one tile, rounded up to whole tiles (a partial
        tile costs a whole one); past `gemm_cluster_rows` (Hopper: two 128-row tiles in a thread-block
        cluster), to whole clusters. Unrounded under fp8 or without a tile."""
        tile = self.gemm_tile
        if not tile or rows <= tile:
            return rows
        step = self.gemm_cluster_rows if self.gemm_cluster_rows and rows > self.gemm_cluster_rows else tile
        return -(-rows // step) * step

    def gemm_slowdown(self, rows: int) -> float:
        """How many times longer a GEMM of `rows` rows computes than its rows say: cuBLAS serves some row
        counts with a slower kernel (`gemm_slow_rows`; the A100's 993-1,024). 1 under fp8 or outside."""
        lo, hi, slow = self.gemm_slow_rows
        return slow if self.dtype != "fp8" and lo <= rows <= hi else 1.0

    @property
    def graph_step_overhead_s(self) -> float:
        return self.step_overhead_s if self.graph_overhead_s is None else self.graph_overhead_s

    def for_dtype(self, dtype: str) -> Hardware:
        """This GPU serving `dtype`: fp8 swaps in the FP8 tensor rate and its GEMM efficiency; bf16 and
        fp16 share one rate; 'auto' is the profile's own dtype."""
        if dtype in ("auto", self.dtype):
            return self
        if dtype == "fp8":
            if not self.peak_flops_fp8:
                raise ConfigError("dtype", f"the {self.label} profile has no FP8 tensor rate",
                                  "use --dtype bfloat16, or a GPU with FP8 (h100, h200, l40s, b200)")
            return self.with_(dtype="fp8")
        if dtype in HALF_DTYPES and self.dtype in HALF_DTYPES:
            return self.with_(dtype=dtype)
        raise ConfigError("dtype", f"the simulated {self.label} runs {self.dtype}, not {dtype}",
                          "use --dtype auto, bfloat16, float16 or fp8, or calibrate a profile in that dtype")

    def with_(self, **changes: object) -> Hardware:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, object], origin: str = "profile") -> Hardware:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError("--gpu", f"{origin} has unknown keys {', '.join(unknown)}",
                              f"a hardware profile holds {', '.join(sorted(known))}")
        missing = [k for k in ("name", "peak_flops", "mem_bw", "memory_bytes") if k not in raw]
        if missing:
            raise ConfigError("--gpu", f"{origin} lacks {', '.join(missing)}")
        raw = dict(raw)
        raw.setdefault("label", raw["name"])
        return cls(**raw)  # type: ignore[arg-type]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# ---------------------------------------------------------------------------------------- presets

_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (SXM)"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (80GB)"
_L40S_DS = "NVIDIA L40S datasheet"
_ADA_WP = "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090)"
_B200_DS = "NVIDIA DGX B200 / HGX B200 datasheet (per GPU)"
FITTED = "fitted to published measurements: itlbench/sim/published.py, docs/perf/sim-vs-published.md"
ASSUMED_LINK = "assumed: a one-shot all-reduce's fixed cost (launch + synchronisation), not a datasheet figure"
MIB = 2 ** 20
# Memory is what the device reports (nvidia-smi's total, what an engine sizes its K/V pool from), not the
# datasheet's "80 GB" read in decimal units: an H100 80GB reports 81,559 MiB (85.5e9 bytes), 7 % more.


def _smi(mib: str) -> str:
    return f"the device reports {mib} MiB (nvidia-smi), used as its memory"


def _gpu(name: str, label: str, bf16: float, fp8: float, bw: float, mem: float, link: str, link_bw: float,
         latency: float, sheet: str, *, bf16_src: str, fp8_src: str, bw_src: str, mem_src: str,
         link_src: str) -> Hardware:
    """The datasheet half of a preset; the efficiencies (`_fitted`) are added below."""
    sources = {"peak_flops": f"{sheet}: {bf16_src}", "peak_flops_fp8": f"{sheet}: {fp8_src}",
               "mem_bw": f"{sheet}: {bw_src}", "memory_bytes": f"{sheet}: {mem_src}",
               "link_bw": f"{sheet}: {link_src}", "link_latency_s": ASSUMED_LINK}
    return Hardware(name, label, bf16, bw, mem, peak_flops_fp8=fp8, interconnect=link, link_bw=link_bw,
                    link_latency_s=latency, source=f"{sheet}; efficiencies {FITTED}", sources=sources)


_DATASHEETS: dict[str, Hardware] = {
    "h100": _gpu("h100", "H100 SXM", 989e12, 1979e12, 3.35e12, 81_559 * MIB, "NVLink 4", 450e9, 8e-6, _H100_DS,
                 bf16_src="BF16 1,979 TFLOPS with sparsity (989 dense)", fp8_src="FP8 3,958 TFLOPS with sparsity "
                 "(1,979 dense)", bw_src="3.35 TB/s HBM3",
                 mem_src=f"80 GB; {_smi('81,559')} (NVIDIA/nccl#1264, modal-labs/modal-client#2797)",
                 link_src="NVLink 900 GB/s (both directions; 450 GB/s each way)"),
    "h200": _gpu("h200", "H200 SXM", 989e12, 1979e12, 4.8e12, 143_771 * MIB, "NVLink 4", 450e9, 8e-6, _H200_DS,
                 bf16_src="BF16 1,979 TFLOPS with sparsity (989 dense)", fp8_src="FP8 3,958 TFLOPS with sparsity "
                 "(1,979 dense)", bw_src="4.8 TB/s HBM3e", mem_src=f"141 GB; {_smi('143,771')} (public logs)",
                 link_src="NVLink 900 GB/s (450 GB/s each way)"),
    "a100": _gpu("a100", "A100 80GB SXM", 312e12, 0.0, 2.039e12, 81_920 * MIB, "NVLink 3", 300e9, 8e-6, _A100_DS,
                 bf16_src="BF16 312 TFLOPS dense (624 with sparsity)", fp8_src="no FP8 tensor cores",
                 bw_src="2,039 GB/s HBM2e (SXM)", mem_src=f"80 GB; {_smi('81,920')} (modal-labs/modal-client#2797)",
                 link_src="NVLink 600 GB/s (300 GB/s each way)"),
    "a100-pcie": _gpu("a100-pcie", "A100 80GB PCIe", 312e12, 0.0, 1.935e12, 81_920 * MIB, "NVLink bridge", 300e9,
                      8e-6, _A100_DS, bf16_src="BF16 312 TFLOPS dense (300 W board; the fit "
                      "gives it its own GEMM efficiency)", fp8_src="no FP8 tensor cores",
                      bw_src="1,935 GB/s HBM2e (PCIe)", mem_src="80 GB; assumed the SXM board's 81,920 MiB",
                      link_src="NVLink bridge for 2 GPUs 600 GB/s (300 GB/s each way); "
                      "Sarathi-Serve's Azure NC A100 v4 pairs"),
    "l40s": _gpu("l40s", "L40S", 362.05e12, 733e12, 864e9, 46_068 * MIB, "PCIe Gen4 x16", 32e9, 15e-6, _L40S_DS,
                 bf16_src="BF16 362.05 TFLOPS dense (733 with sparsity)", fp8_src="FP8 733 TFLOPS dense "
                 "(1,466 with sparsity)", bw_src="864 GB/s GDDR6",
                 mem_src=f"48 GB; {_smi('46,068')} (modal-labs/modal-client#2797)",
                 link_src="PCIe Gen4 x16 64 GB/s (32 GB/s each way), no NVLink"),
    "rtx4090": _gpu("rtx4090", "RTX 4090", 165.2e12, 0.0, 1.008e12, 24e9, "PCIe Gen4 x16", 32e9, 15e-6, _ADA_WP,
                    bf16_src="BF16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.4 with sparsity)",
                    fp8_src="not modelled (GeForce FP8 rates depend on the accumulate type)",
                    bw_src="1,008 GB/s GDDR6X", mem_src="24 GB", link_src="PCIe Gen4 x16 (32 GB/s each way)"),
    "b200": _gpu("b200", "B200", 2250e12, 4500e12, 8e12, 180e9, "NVLink 5", 900e9, 8e-6, _B200_DS,
                 bf16_src="BF16 4.5 PFLOPS with sparsity (2,250 dense)", fp8_src="FP8 9 PFLOPS with sparsity "
                 "(4,500 dense)", bw_src="8 TB/s HBM3e", mem_src="1,440 GB per 8 GPUs (180 GB)",
                 link_src="NVLink 5 1.8 TB/s (900 GB/s each way)"),
}

_TILE_SRC = ("measured: cuBLAS's 16-bit GEMMs in Vidur's operator profiles step at multiples of 128 rows; 128 "
             "fits the Meta-Llama-3-8B A100 profile best (docs/perf/sim-vs-published.md); FP8 GEMMs unrounded")
_CLUSTER_SRC = ("measured: past 256 rows cuBLAS's 16-bit GEMMs on the H100 step at multiples of 256 rows (two 128-row "
                "tiles of a thread-block cluster, NVIDIA H100 Tensor Core GPU Architecture whitepaper); 256 fits Vidur's "
                "Llama-2-70B H100 profile best (docs/perf/sim-vs-published.md); assumed for the H200 (the same SM)")
_SLOW_SRC = ("measured: in Vidur's A100 operator profiles 16-bit GEMMs of 993-1,024 rows run slower than their neighbours "
             "(cuBLAS's kernel for that shape); 1.06x fits the Meta-Llama-3-8B profile best (docs/perf/sim-vs-published.md)")

# Efficiencies and overheads fitted by `sim.published.fit` (run benchmarks/sim_vs_published.py to refit):
# kernel-level figures are shared by every GPU except the large-M GEMM efficiency, which has measurements
# on A100 SXM (Vidur, TensorRT-LLM), A100 PCIe (Sarathi-Serve), H100 FP8 and L40S FP8 (TensorRT-LLM); the
# other GPUs take the A100 SXM's 16-bit one and their generation's FP8 one (H200, B200 the H100's: an
# assumption, marked in their sources). The step overheads are a vLLM-like engine's.
FIT: dict[str, float] = {
    "gemm_eff_a100": 0.7434, "gemm_eff_a100_pcie": 0.8192, "fp8_gemm_eff_h100": 0.5374, "fp8_gemm_eff_ada": 0.8399,
    "gemm_m_half": 17.38, "attn_eff": 0.3613, "mem_eff": 0.8327, "attn_mem_eff": 0.8284, "kernel_s": 5.14e-06,
    "link_eff": 0.8209, "roof_blend": 2.819, "link_latency_s": 6.492e-05, "hopper_mem_gain": 1.072,
    # chosen, not fitted: cuBLAS computes a 16-bit GEMM in tiles of rows. In Vidur's profiles (every 8 rows, A100
    # and H100) a layer 8 rows past a multiple of 128 takes 1.15-1.19x (median) the layer at it. Of power-of-two
    # tiles, 128 fits the profile the fit reads (Meta-Llama-3-8B on the A100, every row) best: MAPE 4.1 % against
    # 4.3 % at 64, 4.5 % at 192, 5.4 % with none (benchmarks/vidur_dense.py; docs/perf/sim-vs-published.md)
    "gemm_tile_rows": 128,
    # chosen, not fitted: past 256 rows Hopper's 16-bit GEMMs step at multiples of 256 (two 128-row tiles in a thread-
    # block cluster; 8 rows past 512 take 1.46x, past 384 1.13x, Vidur's H100 medians). Of 192/256/384/512, 256 fits the
    # Llama-2-70B H100 profile best: MAPE 5.7 % against 6.6 % with none (docs/perf/sim-vs-published.md). Hopper only
    "gemm_cluster_rows_hopper": 256,
    # chosen, not fitted: on the A100 cuBLAS serves the rows just under 1,024 with a slower kernel. Against the model,
    # 993-1,024 rows run 3-8 points slower than 961-992 and 1,025-1,072 in 18 of 24 held-out profile x TP pairs; the fit's
    # own profile is 6-19 points slower up to 1,024 than past it. 1.06 fits that profile best (docs/perf/sim-vs-published.md)
    "gemm_slow_lo_ampere": 993, "gemm_slow_hi_ampere": 1024, "gemm_slow_x_ampere": 1.06,
    # not fitted: a vLLM-like engine's fixed costs, stated as assumptions (vLLM's own latency tests, held out in
    # sim/published.py, check the decode-step one)
    "step_overhead_s": 0.004, "graph_overhead_s": 0.0015, "seq_overhead_s": 20e-6,
}


# FP8 GEMM efficiency is the GPU generation's: Ada (L40S) runs FP8 through the same warp-level MMA
# instructions as its 16-bit types, at twice their rate, where Hopper reaches its FP8 peak only through
# warpgroup MMA fed by the tensor memory accelerator (NVIDIA H100 Tensor Core GPU Architecture
# whitepaper, "H100 SM architecture"); the engines of 2023 reached a different share of each.
ADA = ("l40s", "rtx4090")
# GPUs on a third- (or later) generation NVSwitch baseboard (HGX/DGX): NCCL (2.17+) runs all-reduces as
# NVLink SHARP ("NVLS"), the switch summing, so each GPU sends its message and receives the sum once
# instead of a ring's 2(n-1)/n of it each way. Assumed: the multi-GPU presets are NVSwitch baseboards.
NVLS = ("h100", "h200", "b200")
# Hopper GPUs stream their HBM3/HBM3e at a larger share of the datasheet bandwidth than the A100 its HBM2e:
# Vidur's H100 operator profiles of few-row GEMMs (pure weight reads) run ~8 % faster than the A100's
# fitted shares predict. The gain multiplies both shares (weights; K/V by the same gain, assumed: the same
# HBM), capped at 1; fitted on two of those profiles (docs/perf/sim-vs-published.md). The B200 keeps the A100's shares (no figure measures it).
HOPPER = ("h100", "h200")
AMPERE = ("a100", "a100-pcie")
# An engine of today all-reduces over NVLink with its own one-shot kernels replayed in CUDA graphs (vLLM's
# and SGLang's custom all-reduce, TensorRT-LLM's customAllReduceKernels.cu), not NCCL: the fixed cost is a
# kernel's. TensorRT-LLM 1.0's 28 offline throughputs fit with it (within 13 %), 4 of them over 15 % with
# the 65 us fitted on the NCCL all-reduces of its 2023 releases (docs/perf/sim-vs-published.md).
_CUSTOM_ALLREDUCE = ("assumed: one kernel's least time (kernel_s), an engine's own one-shot all-reduce over "
                     "NVLink; supported by TensorRT-LLM 1.0's offline throughputs (docs/perf/sim-vs-published.md)")
_NVLS = ("NVLink SHARP all-reduce in the NVSwitch (NVIDIA H100 Tensor Core GPU Architecture whitepaper; NCCL 2.17 "
         "release notes, NVLS algorithm); assumed: an HGX/DGX NVSwitch baseboard")


# Where a GPU's assumed FP8 efficiency has held-out figures behind it.
_H200_CHECK = {"h200": " (TensorRT-LLM 1.0's 21 H200 offline throughputs, held out, within 11 % with it)"}


def _fitted(hw: Hardware, fit: dict[str, float]) -> Hardware:
    gemm = fit["gemm_eff_a100_pcie"] if hw.name == "a100-pcie" else fit["gemm_eff_a100"]
    ada = hw.name in ADA
    fp8 = (fit["fp8_gemm_eff_ada"] if ada else fit["fp8_gemm_eff_h100"]) if hw.peak_flops_fp8 else 0.0
    own = hw.name in ("a100", "a100-pcie")
    mem_gain = fit["hopper_mem_gain"] if hw.name in HOPPER else 1.0
    sources = dict(hw.sources) | {
        "gemm_eff": FITTED if own else f"assumed: the A100 SXM's fitted value ({FITTED})",
        "fp8_gemm_eff": (f"fitted on L40S (TensorRT-LLM TTFT), Ada's own: {FITTED}" if ada else
                         f"fitted on H100 (TensorRT-LLM TTFT), assumed on other non-Ada GPUs{_H200_CHECK.get(hw.name, '')}; "
                         f"{FITTED}") if fp8 else "",
        "allreduce_in_switch": _NVLS if hw.name in NVLS else "ring all-reduce over the GPU's link",
        "gemm_m_half": FITTED, "attn_eff": FITTED,
        **dict.fromkeys(("mem_eff", "attn_mem_eff"), f"{FITTED}; Hopper's gain over the A100's share fitted on "
                        "Vidur's H100 operator profiles" if mem_gain != 1.0 else FITTED),
        "kernel_s": FITTED, "link_eff": FITTED, "roof_blend": FITTED, "gemm_tile_rows": _TILE_SRC,
        "gemm_cluster_rows": _CLUSTER_SRC if hw.name in HOPPER else "",
        "gemm_slow_rows": _SLOW_SRC if hw.name in AMPERE else "",
        "link_latency_s": _CUSTOM_ALLREDUCE if hw.link_bw >= 300e9 else
                          f"NCCL's, {FITTED}, or the link's assumed cost where larger (PCIe)",
        "step_overhead_s": "assumed: a vLLM-like engine's eager per-step cost (Sarathi-Serve's prototype, fitted "
                           "separately in sim/published.py, costs more)",
        "graph_overhead_s": "assumed: per-step cost with CUDA graphs replaying decode steps (checked, not fitted: "
                            "vLLM's latency tests on H200, A100 and H100, held out, within 13 % with it)",
        "seq_overhead_s": "assumed: per-sequence input preparation and sampling",
    }
    return hw.with_(cost_model="operators", counting="executed", gemm_eff=gemm, fp8_gemm_eff=fp8,
                    gemm_m_half=fit["gemm_m_half"], attn_eff=fit["attn_eff"], mem_eff=min(1.0, fit["mem_eff"] * mem_gain),
                    attn_mem_eff=min(1.0, fit["attn_mem_eff"] * mem_gain), kernel_s=fit["kernel_s"], link_eff=fit["link_eff"],
                    roof_blend=fit["roof_blend"], gemm_tile_rows=int(fit["gemm_tile_rows"]),
                    gemm_cluster_rows=int(fit["gemm_cluster_rows_hopper"]) if hw.name in HOPPER else 0,
                    gemm_slow_rows=(int(fit["gemm_slow_lo_ampere"]), int(fit["gemm_slow_hi_ampere"]),
                                    fit["gemm_slow_x_ampere"]) if hw.name in AMPERE else (0, 0, 1.0),
                    link_latency_s=fit["kernel_s"] if hw.link_bw >= 300e9 else max(fit["link_latency_s"], hw.link_latency_s),
                    step_overhead_s=fit["step_overhead_s"], graph_overhead_s=fit["graph_overhead_s"],
                    seq_overhead_s=fit["seq_overhead_s"], allreduce_in_switch=hw.name in NVLS, sources=sources)


def presets(fit: dict[str, float] | None = None) -> dict[str, Hardware]:
    """Every preset with the efficiencies of `fit` (default: the fitted `FIT`)."""
    return {name: _fitted(hw, fit or FIT) for name, hw in _DATASHEETS.items()}


_SOURCE_EFF = "efficiencies: the source documents' illustrative 40 % of peak compute, 80 % of bandwidth"


def seeds_profile(hw: Hardware) -> Hardware:
    """The source documents' arithmetic on `hw`'s roofs: whole-step roofline, 40 % of peak compute, 80 %
    of bandwidth, no fixed costs, textbook counting. Reproduces their tables (2.04 s for a 32k prefill of
    Llama-3-8B on an H100, 9.2 ms for a batch-32 decode step)."""
    base = _DATASHEETS.get(hw.name.removesuffix("-seeds"), hw)
    return base.with_(name=f"{base.name}-seeds", label=f"{base.label} (seeds)", source=f"{base.source.split(';')[0]}; "
                      f"{_SOURCE_EFF}", sources=dict(base.sources) | {"gemm_eff": _SOURCE_EFF, "mem_eff": _SOURCE_EFF})


GPUS: dict[str, Hardware] = presets()
SEEDS: dict[str, Hardware] = {f"{k}-seeds": seeds_profile(v) for k, v in _DATASHEETS.items()}
_ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-80g": "a100",
            "a100-sxm": "a100", "4090": "rtx4090", "rtx-4090": "rtx4090", "seeds": "h100-seeds"}
GPU_CHOICES = (*GPUS, "cpu")


# ---------------------------------------------------------------------------------------- this CPU


def measure_cpu(seconds: float = 1.0) -> Hardware:
    """'This CPU': its measured fp32 matmul rate and read bandwidth (`sim.cpu_rates`) as the roofs,
    efficiency 1. Measured, not specified, so the roofs are what this machine reaches, not what it could."""
    import os

    import psutil

    from itlbench.sim.cpu_rates import measure_rates

    flops, bw = measure_rates(seconds)
    return Hardware("cpu", f"this CPU ({os.cpu_count()} cores, measured)", flops, bw,
                    float(psutil.virtual_memory().total), dtype="float32", gemm_eff=1.0, attn_eff=1.0,
                    mem_eff=1.0, counting="executed",
                    source="measured: best fp32 matmul rate (n = 512, 1024) and best read bandwidth (512 MiB sum)")


def load_hardware(spec: str) -> Hardware:
    """A preset name (h100, h200, a100, a100-pcie, l40s, rtx4090, b200), its `-seeds` profile (the source
    documents' 40 %/80 % arithmetic), 'cpu' (measured now), or a profile JSON path."""
    key = spec.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    if key in SEEDS:
        return SEEDS[key]
    if key == "cpu":
        return measure_cpu()
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError("--gpu", f"{path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--gpu", f"{path} does not hold a JSON object")
        return Hardware.from_dict(raw, str(path))
    raise ConfigError("--gpu", f"unknown GPU or profile {spec!r}",
                      f"use one of {', '.join(GPU_CHOICES)}, a preset with -seeds (e.g. h100-seeds), or a profile "
                      "written by `itlbench calibrate`")
