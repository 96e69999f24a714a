"""The GPU presets (datasheet roofs, the efficiencies fitted to published measurements, where each figure comes
from), their `-seeds` profiles, this CPU measured, and `load_hardware`, which turns `--gpu` into a profile.

The profile itself (`Hardware`, the number formats) is sim/profile.py; its names are re-exported here.
Torch-free on purpose: the simulator and the CLI import it.
"""

from __future__ import annotations

from pathlib import Path

from itlbench.errors import ConfigError
from itlbench.json_file import read_json_object
from itlbench.sim.allreduce_tables import ALLREDUCE_2025_US, measured_tables
from itlbench.sim.profile import (  # noqa: F401 (re-exported: the profile's public names)
    COST_MODELS,
    COUNTINGS,
    DEFAULT_KV_DTYPE,
    DTYPE_BYTES,
    HALF_DTYPES,
    QUANTIZED,
    TABLE_DTYPE,
    CostModelKind,
    Counting,
    Hardware,
    kv_dtype_bytes,
)

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
         link_src: str, fp4: float = 0.0, fp4_src: str = "no FP4 tensor cores") -> Hardware:
    """The datasheet half of a preset; the efficiencies (`_fitted`) are added below."""
    sources = {"peak_flops": f"{sheet}: {bf16_src}", "peak_flops_fp8": f"{sheet}: {fp8_src}",
               "peak_flops_fp4": f"{sheet}: {fp4_src}", "mem_bw": f"{sheet}: {bw_src}",
               "memory_bytes": f"{sheet}: {mem_src}", "link_bw": f"{sheet}: {link_src}", "link_latency_s": ASSUMED_LINK}
    return Hardware(name, label, bf16, bw, mem, peak_flops_fp8=fp8, peak_flops_fp4=fp4, interconnect=link,
                    link_bw=link_bw, link_latency_s=latency, source=f"{sheet}; efficiencies {FITTED}", sources=sources)


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
    "b200": _gpu("b200", "B200", 2250e12, 4500e12, 8e12, 183_359 * MIB, "NVLink 5", 900e9, 8e-6, _B200_DS,
                 bf16_src="BF16 4.5 PFLOPS with sparsity (2,250 dense)", fp8_src="FP8 9 PFLOPS with sparsity "
                 "(4,500 dense)", bw_src="8 TB/s HBM3e",
                 mem_src=f"1,440 GB per 8 GPUs (180 GB); {_smi('183,359')} (public logs)",
                 link_src="NVLink 5 1.8 TB/s (900 GB/s each way)", fp4=9000e12,
                 fp4_src="FP4 18 PFLOPS with sparsity (9,000 dense; 144 PFLOPS per 8 GPUs)"),
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
    "gemm_eff_a100": 0.7434, "gemm_eff_a100_pcie": 0.8276, "fp8_gemm_eff_h100": 0.5757, "fp8_gemm_eff_ada": 0.8731,
    "gemm_m_half": 17.26, "attn_eff": 0.3693, "mem_eff": 0.833, "attn_mem_eff": 0.8317, "kernel_s": 5.142e-06,
    "link_eff": 0.8625, "roof_blend": 2.817, "link_latency_s": 6.494e-05, "hopper_mem_gain": 1.072,
    # fitted on two of TensorRT-LLM 1.0's B200 NVFP4 offline runs (Llama-3.3-70B TP1, 128/4,096 and 2,048/128), the
    # other twelve held out: the K/V read share's factor on Blackwell and its NVFP4 GEMM efficiency
    "blackwell_kv_gain": 0.7468, "fp4_gemm_eff_blackwell": 0.4561,
    # chosen, not fitted: cuBLAS computes a 16-bit GEMM in tiles of rows. In Vidur's profiles (every 8 rows, A100
    # and H100) a layer 8 rows past a multiple of 128 takes 1.15-1.19x (median) the layer at it. Of power-of-two
    # tiles, 128 fits the profile the fit reads (Meta-Llama-3-8B on the A100, every row) best: MAPE 4.1 % against
    # 4.3 % at 64, 4.5 % at 192, 5.4 % with none (benchmarks/vidur_dense.py; docs/perf/sim-vs-published-log.md)
    "gemm_tile_rows": 128,
    # chosen, not fitted: past 256 rows Hopper's 16-bit GEMMs step at multiples of 256 (two 128-row tiles in a thread-
    # block cluster; 8 rows past 512 take 1.46x, past 384 1.13x, Vidur's H100 medians). Of 192/256/384/512, 256 fits the
    # Llama-2-70B H100 profile best: MAPE 5.7 % against 6.6 % with none (docs/perf/sim-vs-published-log.md). Hopper only
    "gemm_cluster_rows_hopper": 256,
    # chosen, not fitted: on the A100 cuBLAS serves the rows just under 1,024 with a slower kernel. Against the model,
    # 993-1,024 rows run 3-8 points slower than 961-992 and 1,025-1,072 in 18 of 24 held-out profile x TP pairs; the fit's
    # own profile is 6-19 points slower up to 1,024 than past it. 1.06 fits that profile best (docs/perf/sim-vs-published-log.md)
    "gemm_slow_lo_ampere": 993, "gemm_slow_hi_ampere": 1024, "gemm_slow_x_ampere": 1.06,
    # not fitted: a vLLM-like engine's fixed costs, stated as assumptions (vLLM's own latency tests, held out in
    # sim/published.py, check the decode-step one)
    "step_overhead_s": 0.004, "graph_overhead_s": 0.0015, "seq_overhead_s": 20e-6,
}


# Prefill attention's length ramp (`attn_k_half`: the keys a query reads at which it runs at half attn_eff): not fitted
# on the published figures, which hardly test attention past 2,048 tokens. Each GPU takes the value fitted on vLLM's
# measured attention kernel (`ATTENTION_2025`, benchmarks/aic_attention.py --fit), the A100 PCIe the A100's and the
# RTX 4090 the L40S's (the same SMs; assumed); attn_eff and every other term were refitted with it
# (docs/perf/sim-vs-published-log.md: held out, MAPE 5.6 -> 5.3 %, 10 -> 7 figures over 15 %)
_K_HALF_OF = {"a100-pcie": "a100", "rtx4090": "l40s"}


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
# HBM), capped at 1; fitted on two of those profiles (docs/perf/sim-vs-published-log.md). The B200 keeps the A100's weight share (its K/V share: BLACKWELL below).
HOPPER = ("h100", "h200")
AMPERE = ("a100", "a100-pcie")
# Blackwell's decode reads its K/V at a smaller share of the datasheet bandwidth than the A100 fit gives, and its
# NVFP4 GEMMs run at under half the dense FP4 rate: TensorRT-LLM 1.0's B200 offline runs with the A100's share and
# the H100's FP8 efficiency come out 16-36 % fast. Both fitted on two of them (docs/perf/sim-vs-published-log.md).
BLACKWELL = ("b200",)
# An engine of today all-reduces over NVLink with its own one-shot kernels replayed in CUDA graphs (vLLM's
# and SGLang's custom all-reduce, TensorRT-LLM's customAllReduceKernels.cu), not NCCL: the fixed cost is a
# kernel's. TensorRT-LLM 1.0's 28 offline throughputs fit with it (within 13 %), 4 of them over 15 % with
# the 65 us fitted on the NCCL all-reduces of its 2023 releases (docs/perf/sim-vs-published-log.md).
_CUSTOM_ALLREDUCE = ("assumed: one kernel's least time (kernel_s), an engine's own one-shot all-reduce over "
                     "NVLink; supported by TensorRT-LLM 1.0's offline throughputs (docs/perf/sim-vs-published.md)")
_NVLS = ("NVLink SHARP all-reduce in the NVSwitch (NVIDIA H100 Tensor Core GPU Architecture whitepaper; NCCL 2.17 "
         "release notes, NVLS algorithm); assumed: an HGX/DGX NVSwitch baseboard")
_SWITCH_SHARE = ("measured by others: NCCL's NVLink SHARP all-reduce peaks near algbw 275 GB/s (busBw ~480) on eight "
                 "H100s, 0.61 of the 450 GB/s link, while a ring reaches ~370 GB/s of it (NVIDIA/nccl-tests#212); the "
                 "same share assumed for the H200 (the same NVSwitch) and the B200 (NVLink 5)")


# Where a GPU's assumed FP8 efficiency has held-out figures behind it.
_H200_CHECK = {"h200": " (TensorRT-LLM 1.0's 21 H200 offline throughputs, held out, within 11 % with it)"}


def _fitted(hw: Hardware, fit: dict[str, float]) -> Hardware:
    gemm = fit["gemm_eff_a100_pcie"] if hw.name == "a100-pcie" else fit["gemm_eff_a100"]
    ada = hw.name in ADA
    fp8 = (fit["fp8_gemm_eff_ada"] if ada else fit["fp8_gemm_eff_h100"]) if hw.peak_flops_fp8 else 0.0
    own = hw.name in ("a100", "a100-pcie")
    mem_gain = fit["hopper_mem_gain"] if hw.name in HOPPER else 1.0
    kv_gain = fit["blackwell_kv_gain"] if hw.name in BLACKWELL else 1.0
    k_half_gpu = _K_HALF_OF.get(hw.name, hw.name)
    sources = dict(hw.sources) | {
        "gemm_eff": FITTED if own else f"assumed: the A100 SXM's fitted value ({FITTED})",
        "fp8_gemm_eff": (f"fitted on L40S (TensorRT-LLM TTFT), Ada's own: {FITTED}" if ada else
                         f"fitted on H100 (TensorRT-LLM TTFT), assumed on other non-Ada GPUs{_H200_CHECK.get(hw.name, '')}; "
                         f"{FITTED}") if fp8 else "",
        "fp4_gemm_eff": f"fitted on two of TensorRT-LLM 1.0's B200 NVFP4 offline runs, twelve held out; {FITTED}"
                        if hw.peak_flops_fp4 else "",
        "allreduce_in_switch": _NVLS if hw.name in NVLS else "ring all-reduce over the GPU's link",
        "link_domain": "assumed: one HGX/DGX baseboard's NVSwitch joins 8 GPUs" if hw.name in NVLS else
                       "assumed: 8 GPUs in one server",
        "switch_allreduce_share": _SWITCH_SHARE if hw.name in NVLS else "",
        "gemm_m_half": FITTED, "attn_eff": FITTED,
        "attn_k_half": f"measured: fitted on vLLM's attention kernel ({ATTENTION_2025[k_half_gpu][3].split(':')[0]}; "
                       f"ai-dynamo/aiconfigurator, benchmarks/aic_attention.py --fit)"
                       + ("" if k_half_gpu == hw.name else f", the {k_half_gpu} preset's, assumed"),
        **dict.fromkeys(("mem_eff", "attn_mem_eff"), f"{FITTED}; Hopper's gain over the A100's share fitted on "
                        "Vidur's H100 operator profiles" if mem_gain != 1.0 else FITTED),
        **({"attn_mem_eff": f"{FITTED}; Blackwell's K/V read share fitted on TensorRT-LLM 1.0's B200 offline runs"}
           if hw.name in BLACKWELL else {}),
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
                    gemm_m_half=fit["gemm_m_half"], attn_eff=fit["attn_eff"],
                    attn_k_half=float(ATTENTION_2025[k_half_gpu][1]), mem_eff=min(1.0, fit["mem_eff"] * mem_gain),
                    attn_mem_eff=min(1.0, fit["attn_mem_eff"] * mem_gain * kv_gain), kernel_s=fit["kernel_s"],
                    link_eff=fit["link_eff"], fp4_gemm_eff=fit["fp4_gemm_eff_blackwell"] if hw.peak_flops_fp4 else 0.0,
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


# The `-2025` profiles. A 16-bit GEMM's two terms on the kernels engines ship today, no partial-tile rounding: fitted by
# `benchmarks/aic_gemms.py --fit` on NVIDIA's measured Linear-layer tables in ai-dynamo/aiconfigurator (commit 095f58a,
# aic-core/src/aiconfigurator_core/systems/data/{gpu}/gemm/vllm/{version}/gemm_perf.parquet, n and k of 4,096 or
# more): (gemm_eff, gemm_m_half, the table). Today's Hopper kernels take 1.01-1.09x the time one row past 128, 256 or
# 512 rows where the presets, read off Vidur's 2024 cuBLAS profiles, charge 1.23-1.74x (docs/perf/sim-vs-published-log.md).
KERNELS_2025: dict[str, tuple[float, float, str]] = {
    "h100": (0.830, 0.0, "vLLM 0.24.0, H100 SXM: 7,326 shapes, MAPE 14.4 % as the preset, 5.9 % refitted"),
    "h200": (0.813, 0.0, "vLLM 0.24.0, H200 SXM: 7,326 shapes, MAPE 15.2 % as the preset, 6.1 % refitted"),
    "b200": (0.716, 3.1, "vLLM 0.24.0, B200: 7,326 shapes, MAPE 6.9 % as the preset, 6.0 % refitted"),
    "a100": (0.945, 82.8, "vLLM 0.14.0, A100 SXM: 1,680 shapes, MAPE 13.5 % as the preset, 7.9 % refitted"),
    "l40s": (0.702, 117.4, "vLLM 0.24.0, L40S: 7,256 shapes, MAPE 9.3 % as the preset, 8.2 % refitted"),
}

# The same GPUs' attention as vLLM's kernels run it (ai-dynamo/aiconfigurator, commit 095f58a, attention/vllm/{version}/
# {context,generation}_attention_perf.parquet; Llama-like heads, 16-bit K/V): prefill's attn_eff and attn_k_half and
# decode's attn_mem_eff, fitted with the preset's kernel fixed cost by `benchmarks/aic_attention.py --fit`.
# GPU: (attn_eff, attn_k_half, attn_mem_eff, the tables and the MAPE these terms fit them to, prefill; decode)
ATTENTION_2025: dict[str, tuple[float, float, float, str]] = {
    "h100": (0.695, 600, 0.835, "vLLM 0.24.0 FA3, H100 SXM: prefill 1,315 rows, MAPE 14.9 %; decode 412, 10.2 %"),
    "h200": (0.649, 500, 0.789, "vLLM 0.24.0 FA3, H200 SXM: prefill 1,315 rows, MAPE 14.6 %; decode 412, 13.3 %"),
    "b200": (0.566, 600, 0.818, "vLLM 0.24.0 FlashInfer (TensorRT-LLM kernels), B200: prefill 1,315 rows, MAPE 19.6 %; "
                                "decode 412, 8.6 %"),
    "a100": (0.595, 300, 0.708, "vLLM 0.14.0 FlashAttention, A100 SXM: prefill 1,385 rows, MAPE 14.2 %; decode 279, "
                                "11.0 %"),
    "l40s": (0.514, 200, 0.776, "vLLM 0.24.0 FA2, L40S: prefill 1,300 rows, MAPE 10.2 %; decode 412, 6.7 %"),
}


def kernels_2025_profile(hw: Hardware) -> Hardware:
    """`hw`'s preset with its 16-bit GEMMs, attention and all-reduces as today's engines run them: no partial-tile
    rounding, the large-M efficiency and half-rows fitted on NVIDIA's kernel tables (`KERNELS_2025`), attention whose
    prefill efficiency rises with the keys a query reads and decode's K/V share, both fitted on vLLM's kernels
    (`ATTENTION_2025`), and vLLM's measured all-reduce times at TP2, 4 and 8 (sim/allreduce_tables.py). Every other
    term (bandwidth, FP8/FP4 efficiency, fixed costs) is the preset's: those tables time FP8 with its dynamic scaling,
    not what a checkpoint with static scales runs, and no engine-level figure has checked this profile."""
    eff, m_half, table = KERNELS_2025[hw.name]
    attn_eff, k_half, attn_mem_eff, attn_table = ATTENTION_2025[hw.name]
    attn_src = (f"fitted on NVIDIA's measured attention kernels ({attn_table}; ai-dynamo/aiconfigurator, "
                "benchmarks/aic_attention.py --fit); no engine-level published figure checks this profile")
    src = (f"fitted on NVIDIA's measured kernel table ({table}; ai-dynamo/aiconfigurator, benchmarks/aic_gemms.py "
           "--fit); no engine-level published figure checks this profile")
    engine = ALLREDUCE_2025_US[hw.name][0]
    ar_src = (f"measured: {engine}'s 16-bit all-reduce in a CUDA graph at TP2/4/8, ai-dynamo/aiconfigurator "
              f"(commit 095f58a) custom_allreduce_perf.parquet; interpolated, in place of link_bw x link_eff")
    return hw.with_(name=f"{hw.name}-2025", label=f"{hw.label} (2025 kernels)", gemm_eff=eff, gemm_m_half=m_half,
                    attn_eff=attn_eff, attn_k_half=k_half, attn_mem_eff=attn_mem_eff,
                    source=f"{hw.source.split(';')[0]}; 16-bit GEMMs, attention and all-reduces as NVIDIA measured "
                           f"2025 engines run them, the rest as the {hw.name} preset",
                    gemm_tile_rows=0, gemm_cluster_rows=0, gemm_slow_rows=(0, 0, 1.0),
                    allreduce_measured=measured_tables(hw.name),
                    sources=dict(hw.sources) | {"gemm_eff": src, "gemm_m_half": src, "gemm_tile_rows": "0: " + src,
                                                "gemm_cluster_rows": "", "gemm_slow_rows": "",
                                                "attn_eff": attn_src, "attn_k_half": attn_src,
                                                "attn_mem_eff": attn_src, "allreduce_measured": ar_src})


GPUS: dict[str, Hardware] = presets()
SEEDS: dict[str, Hardware] = {f"{k}-seeds": seeds_profile(v) for k, v in _DATASHEETS.items()}
KERNELS: dict[str, Hardware] = {f"{k}-2025": kernels_2025_profile(GPUS[k]) for k in KERNELS_2025}
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


_PROFILE_FIX = ("write a profile as `itlbench calibrate` saves one, or a preset's keys: "
                '{"name": "my-h100", "peak_flops": 9.89e14, "mem_bw": 3.35e12, "memory_bytes": 8.0e10}')


def _h100_example(key: str) -> str:
    """A profile key's example value for an error's fix: the h100 preset's."""
    value = getattr(GPUS["h100"], key, None)
    if value is None:
        return ""
    return f"e.g. {value:g}, the h100 preset's" if isinstance(value, float) else f"e.g. {value!r}, the h100 preset's"


def load_hardware(spec: str, flag: str = "--gpu") -> Hardware:
    """A preset name (h100, h200, a100, a100-pcie, l40s, rtx4090, b200), its `-seeds` profile (the source
    documents' 40 %/80 % arithmetic), its `-2025` profile (today's 16-bit GEMM kernels, where NVIDIA's tables cover
    the GPU), 'cpu' (measured now), or a profile JSON path."""
    key = spec.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    if key in SEEDS:
        return SEEDS[key]
    if key in KERNELS:
        return KERNELS[key]
    if key == "cpu":
        return measure_cpu()
    path = Path(spec).expanduser()
    if path.is_file():
        raw = read_json_object(path, _PROFILE_FIX, flag)
        return Hardware.from_dict(raw, str(path), flag, _h100_example)
    raise ConfigError(flag, f"unknown GPU or profile {spec!r}",
                      f"use one of {', '.join(GPU_CHOICES)}, a preset with -seeds (e.g. h100-seeds) or -2025 (one "
                      f"of {', '.join(KERNELS)}), or a profile written by `itlbench calibrate`")
