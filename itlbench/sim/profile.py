"""One accelerator's profile for the cost model: roofs, interconnect, efficiencies, overheads, and where each
figure comes from; and the number formats it serves.

A `Hardware` holds what one GPU can do (datasheet roofs: dense tensor rate per dtype, memory bandwidth
and capacity, the GPU-to-GPU link a tensor-parallel all-reduce crosses) and what a serving engine reaches
on it (efficiencies, a minimum time per kernel, fixed costs per step). Two ways to turn a step into time
(`cost_model`):

- "roofline": the source documents' whole-step arithmetic, max(FLOPs / (peak·e), bytes / (bw·e)) plus
  overheads. The `-seeds` profiles (h100-seeds, ...) use it at their illustrative 40 % / 80 %, so their
  tables come out unchanged; `itlbench calibrate` profiles use it with fitted efficiencies.
- "operators": a roofline per kernel (each weight GEMM, attention, the element-wise kernels, two
  all-reduces per layer under tensor parallelism), GEMM efficiency falling at few rows, plus a fixed
  per-step cost that CUDA graphs shrink. The presets (h100, a100, ...; sim/hardware.py) use it, with
  efficiencies fitted to published measurements (sim/published.py; docs/perf/sim-vs-published.md).

Torch-free on purpose: the simulator and the CLI import it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal, get_type_hints

from itlbench.core.engine_config import KV_CACHE_DTYPES
from itlbench.core.json_fields import fits, type_name
from itlbench.errors import ConfigError

Counting = Literal["textbook", "executed"]
COUNTINGS: tuple[str, ...] = ("textbook", "executed")
CostModelKind = Literal["roofline", "operators"]
COST_MODELS: tuple[str, ...] = ("roofline", "operators")
# NVFP4 ("fp4"): 4-bit E2M1 values with one FP8 E4M3 scale per 16 (NVIDIA's Blackwell format), 4.5 bits a weight.
# Its checkpoints keep the embedding and LM head in 16 bits and carry an FP8 K/V cache: nvidia/Llama-3.3-70B-Instruct-
# NVFP4's hf_quant_config.json (quant_algo NVFP4, group_size 16, kv_cache_quant_algo FP8, lm_head excluded) and its
# index (42,709,045,632 bytes, what 0.5625 bytes per linear weight and 16-bit tables give, within 0.01 %).
DTYPE_BYTES: dict[str, float] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp4": 0.5625}
QUANTIZED = ("fp8", "fp4")  # weight GEMMs at their own tensor rate, unrounded to 16-bit tiles
# embedding and LM head in these, where not the weights' dtype: FP8 and NVFP4 checkpoints quantize the layers' linear
# weights only (ModelOpt's leave the LM head out; vLLM and TensorRT-LLM load both tables in 16 bits)
TABLE_DTYPE = {"fp4": "bfloat16", "fp8": "bfloat16"}
DEFAULT_KV_DTYPE = {"fp4": "fp8"}  # the K/V cache's dtype under --kv-cache-dtype auto, where not the weights'

HALF_DTYPES = ("bfloat16", "float16")  # same tensor rate on every preset
_REQUIRED_EXAMPLE = {"name": '"my-h100"', "peak_flops": "9.89e14", "mem_bw": "3.35e12", "memory_bytes": "8.0e10"}


def kv_dtype_bytes(kv_cache_dtype: str) -> int | None:
    """Bytes per K/V element of `--kv-cache-dtype` (None for auto: the weights' dtype)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError("kv_cache_dtype", f"unknown dtype {kv_cache_dtype!r}", f"use one of {', '.join(KV_CACHE_DTYPES)}")
    return None if kv_cache_dtype == "auto" else int(DTYPE_BYTES[kv_cache_dtype])


@dataclass(frozen=True)
class Hardware:
    """One accelerator's roofs, the efficiencies an engine reaches on it, and its fixed costs.

    `peak_flops` is the dense half-precision rate (float32 for a CPU; no sparsity), `peak_flops_fp8` the dense FP8 rate (0: no
    FP8 tensor cores), `peak_flops_fp4` the dense NVFP4 rate (0: none; Blackwell's); `mem_bw` the memory bandwidth in bytes/s; `memory_bytes` what holds weights and
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
    peak_flops_fp4: float = 0.0
    fp4_gemm_eff: float = 0.0  # 0: fp8_gemm_eff, else gemm_eff
    gemm_m_half: float = 0.0  # rows at which a GEMM reaches half its large-M efficiency (operators)
    attn_mem_eff: float = 0.0  # share of bandwidth attention reaches reading K/V (0: mem_eff)
    # keys a query reads at which prefill attention runs at half attn_eff (0: attn_eff at every length) (operators)
    attn_k_half: float = 0.0
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
    link_domain: int = 8  # GPUs the link joins (an HGX baseboard's NVSwitch: 8); a larger --tp would cross servers
    allreduce_in_switch: bool = False  # the switch can reduce (NVLink SHARP): each GPU sends and receives the message once
    # NVLink SHARP's all-reduce throughput (algbw) as a share of the link: NCCL's peaks near 275 GB/s on eight H100s
    # (busBw ~480), 0.61 of NVLink4's 450 GB/s each way (NVIDIA/nccl-tests#212, an NCCL maintainer's figures)
    switch_allreduce_share: float = 0.611
    # measured all-reduce times, {degree: ((message bytes, seconds), ...)} sorted by size: where the run's degree has
    # one, an all-reduce is interpolated in it instead of priced by the link (sim/allreduce_tables.py)
    allreduce_measured: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict, hash=False)
    sources: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "mem_bw", "memory_bytes", "gemm_eff", "attn_eff", "mem_eff", "link_eff",
                     "switch_allreduce_share"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"gpu.{name}", f"must be a positive number, got {value!r}")
        for name in ("step_overhead_s", "seq_overhead_s", "peak_flops_fp8", "fp8_gemm_eff", "peak_flops_fp4", "fp4_gemm_eff", "gemm_m_half",
                     "attn_mem_eff", "attn_k_half", "gqa_kv_reread", "kernel_s", "roof_blend", "link_bw", "link_latency_s",
                     "prefill_overhead_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0):
                raise ConfigError(f"gpu.{name}", f"must be >= 0, got {value!r}")
            if not math.isfinite(value):  # an infinite overhead ran until the virtual clock's round(inf) raised
                raise ConfigError(f"gpu.{name}", f"must be a finite number, got {value!r}")
        for name in ("gemm_tile_rows", "gemm_cluster_rows"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ConfigError(f"gpu.{name}", f"must be a whole number >= 0, got {value!r}")
        if not (isinstance(self.link_domain, int) and self.link_domain >= 1):
            raise ConfigError("gpu.link_domain", f"must be a whole number >= 1, got {self.link_domain!r}",
                              "e.g. 8, the GPUs of one HGX baseboard")
        try:
            lo, hi, slow = self.gemm_slow_rows
            ok = 0 <= lo <= hi and 1 <= slow < math.inf
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError("gpu.gemm_slow_rows", "must be [lo, hi, x] with 0 <= lo <= hi and x finite and >= 1, "
                              f"got {self.gemm_slow_rows!r}", "e.g. [0, 0, 1], no slow band")
        object.__setattr__(self, "gemm_slow_rows", (int(lo), int(hi), float(slow)))  # a JSON profile's list
        object.__setattr__(self, "allreduce_measured", _measured_allreduce(self.allreduce_measured))
        if self.graph_overhead_s is not None and not 0 <= self.graph_overhead_s < math.inf:
            raise ConfigError("gpu.graph_overhead_s",
                              f"must be a finite number >= 0 or null, got {self.graph_overhead_s!r}",
                              "null: step_overhead_s")
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
    def dtype_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def table_dtype(self) -> str:
        """The embedding's and LM head's dtype: 16-bit under fp8 and fp4 (their checkpoints leave them unquantized)."""
        return TABLE_DTYPE.get(self.dtype, self.dtype)

    @property
    def default_kv_bytes(self) -> int:
        """Bytes per K/V element under --kv-cache-dtype auto: the weights' dtype, FP8 under fp4."""
        return int(DTYPE_BYTES[DEFAULT_KV_DTYPE.get(self.dtype, self.dtype)])

    @property
    def gemm_peak(self) -> float:
        """The weight GEMMs' dense rate: FP8's or FP4's when serving those (attention stays at the half rate)."""
        return self.gemm_peak_of(self.dtype)

    def gemm_peak_of(self, dtype: str) -> float:
        if dtype == "fp8":
            return self.peak_flops_fp8
        return self.peak_flops_fp4 if dtype == "fp4" else self.peak_flops

    @property
    def gemm_efficiency(self) -> float:
        return self.gemm_efficiency_of(self.dtype)

    def gemm_efficiency_of(self, dtype: str) -> float:
        """The large-M GEMM efficiency in `dtype`: FP4 takes FP8's unless given its own (assumed: both run
        the same generation's low-precision tensor-core path), FP8 the 16-bit one unless given its own."""
        if dtype not in QUANTIZED:
            return self.gemm_eff
        fp8 = self.fp8_gemm_eff or self.gemm_eff
        return (self.fp4_gemm_eff or fp8) if dtype == "fp4" else fp8

    @property
    def gemm_tile(self) -> int:
        """Rows a GEMM's compute is rounded up to a multiple of: the 16-bit tile (`gemm_tile_rows`); 0 under
        fp8 and fp4, whose kernels no profile here measures rounding for (docs/perf/sim-vs-published.md)."""
        return 0 if self.dtype in QUANTIZED else self.gemm_tile_rows

    def gemm_rows_computed(self, rows: int) -> int:
        """Rows a 16-bit GEMM of `rows` rows computes: past one tile, rounded up to whole tiles (a partial
        tile costs a whole one); past `gemm_cluster_rows` (Hopper: two 128-row tiles in a thread-block
        cluster), to whole clusters. Unrounded under fp8/fp4 or without a tile."""
        tile = self.gemm_tile
        if not tile or rows <= tile:
            return rows
        step = self.gemm_cluster_rows if self.gemm_cluster_rows and rows > self.gemm_cluster_rows else tile
        return -(-rows // step) * step

    def gemm_slowdown(self, rows: int) -> float:
        """How many times longer a GEMM of `rows` rows computes than its rows say: cuBLAS serves some row
        counts with a slower kernel (`gemm_slow_rows`; the A100's 993-1,024). 1 under fp8/fp4 or outside."""
        lo, hi, slow = self.gemm_slow_rows
        return slow if self.dtype not in QUANTIZED and lo <= rows <= hi else 1.0

    @property
    def graph_step_overhead_s(self) -> float:
        return self.step_overhead_s if self.graph_overhead_s is None else self.graph_overhead_s

    @property
    def the_label(self) -> str:
        """The label as a sentence names it: 'the H100 SXM', but 'this CPU (…)' as it is."""
        return self.label if self.label.startswith("this ") else f"the {self.label}"

    def formats(self) -> list[str]:
        """The --dtype values this profile runs, for a fix that names only what works here."""
        own = ["bfloat16", "float16"] if self.dtype in HALF_DTYPES else [self.dtype]
        return own + ["fp8"] * bool(self.peak_flops_fp8) + ["fp4"] * bool(self.peak_flops_fp4)

    def _no_rate(self, dtype: str, rate: str, gpus: str) -> ConfigError:
        return ConfigError("dtype", f"{self.the_label} profile has no {rate} tensor rate",
                           f"use --dtype {_either(self.formats())} here, or a GPU with {rate} ({gpus})")

    def for_dtype(self, dtype: str) -> Hardware:
        """This GPU serving `dtype`: fp8 (fp4) swaps in the FP8 (NVFP4) tensor rate and its GEMM efficiency;
        bf16 and fp16 share one rate; 'auto' is the profile's own dtype."""
        if dtype in ("auto", self.dtype):
            return self
        if dtype == "fp8":
            if not self.peak_flops_fp8:
                raise self._no_rate(dtype, "FP8", "h100, h200, l40s, b200")
            return self.with_(dtype="fp8")
        if dtype == "fp4":
            if not self.peak_flops_fp4:
                raise self._no_rate(dtype, "FP4", "b200")
            return self.with_(dtype="fp4")
        if dtype in HALF_DTYPES and self.dtype in HALF_DTYPES:
            return self.with_(dtype=dtype)
        raise ConfigError("dtype", f"{self.the_label} (simulated) runs {self.dtype}, not {dtype}",
                          f"use --dtype {_either(['auto', *self.formats()])}, or calibrate a profile in {dtype}")

    def with_(self, **changes: object) -> Hardware:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, object], origin: str = "profile", flag: str = "--gpu",
                  example: Callable[[str], str] | None = None) -> Hardware:
        """A profile as `save` writes it; `flag` is the option that named the file, and `example` a key's example
        value (a preset's), for the error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(flag, f"{origin} has unknown keys {', '.join(unknown)}",
                              f"a hardware profile holds {', '.join(sorted(known))}")
        missing = [k for k in ("name", "peak_flops", "mem_bw", "memory_bytes") if k not in raw]
        if missing:
            raise ConfigError(flag, f"{origin} lacks {', '.join(missing)}", "add them as an H100's would read: "
                              + ", ".join(f'"{k}": {_REQUIRED_EXAMPLE[k]}' for k in missing))
        hints = get_type_hints(cls)
        for name, value in raw.items():
            if not fits(value, hints[name]):
                raise ConfigError(flag, f"{origin}: {name} is {json.dumps(value)}", f"give {type_name(hints[name])}")
        raw = dict(raw)
        raw.setdefault("label", raw["name"])
        try:
            return cls(**raw)  # type: ignore[arg-type]
        except ConfigError as exc:  # a value in the file: name the file and the flag that named it
            key = exc.field.removeprefix("gpu.")
            fix = "; ".join(t for t in (example(key) if example else "", exc.fix) if t)
            raise ConfigError(flag, f"{origin}: {key} {exc.problem}", fix) from None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _measured_allreduce(raw: object) -> dict[str, tuple[tuple[float, float], ...]]:
    """`allreduce_measured` as tuples (a JSON profile's lists), checked: whole-number degrees of 2 or more, each with
    (bytes, seconds) points of positive numbers, sizes rising."""
    fix = 'e.g. {"8": [[256, 4.6e-06], [1048576, 1.5e-05]]}: degree -> [message bytes, seconds], sizes rising'
    if not isinstance(raw, dict):
        raise ConfigError("gpu.allreduce_measured", f"must map degrees to points, got {raw!r}", fix)
    out = {}
    for tp, points in raw.items():
        try:
            pts = tuple((float(b), float(t)) for b, t in points)
            finite = all(0 < b < math.inf and 0 < t < math.inf for b, t in pts)
            ok = str(tp).isdigit() and int(tp) >= 2 and len(pts) >= 2 and finite \
                and all(b0 < b1 for (b0, _), (b1, _) in zip(pts, pts[1:], strict=False))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError("gpu.allreduce_measured", f"degree {tp!r} does not hold rising (bytes, seconds) points",
                              fix)
        out[str(int(tp))] = pts
    return out


def _either(options: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
