"""TensorRT-LLM's published offline throughputs (`trtllm-bench throughput`) and the simulator's prediction of each.

Two releases of docs/source/performance/perf-overview.md (NVIDIA/TensorRT-LLM, PyTorch backend): release 1.0's
tables, and release 0.20's Llama tables: the 70B at TP1-8 on H200, H100 and B200, the 405B at TP4 and TP8 on B200 and
TP8 on H200 and H100 in FP8, which test how the simulator scales with the degree of tensor parallelism, and the 8B
at TP1 (its Llama 4 Maverick is left out: a mixture of experts, see OVERVIEW_V020). Each figure is the time to serve a fixed-length
dataset queued at once, predicted through trtllm-bench's settings and an in-flight schedule (sim/trtllm_bench.py) on
the presets, with each release's fixed costs: release 0.20's backend also waits on its host for each request a step.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable

from itlbench.core.presets import PRESETS
from itlbench.sim.hardware import FIT, KERNELS_2025, Hardware, kernels_2025_profile, presets
from itlbench.sim.roofline import CostModel
from itlbench.sim.trtllm_bench import bench_settings, deployment_kv_bytes, offline_seconds, schedulable

Deployment = tuple[str, str, int, str]  # model, gpu, tp, dtype


KERNELS_2025_FLAG = "kernels_2025"  # a nonzero value in the params: predict on the `-2025` profiles where a GPU has one


def fitted_presets(params: dict[str, float]) -> dict[str, Hardware]:
    """The presets with `params`' values for the fitted parameters they read; with `KERNELS_2025_FLAG` set, each GPU
    that has a `-2025` profile takes it (vLLM's kernels of 2025 on the preset's fitted rest), so the same figures
    check that profile at engine level (`benchmarks/sim_vs_published.py --kernels 2025`)."""
    gpus = presets({**FIT, **{k: v for k, v in params.items() if k in FIT}})
    if params.get(KERNELS_2025_FLAG):
        gpus = {name: kernels_2025_profile(hw) if name in KERNELS_2025 else hw for name, hw in gpus.items()}
    return gpus


# TensorRT-LLM docs/source/performance/perf-overview.md (v1.0, PyTorch backend): total output tokens/s of
# `trtllm-bench throughput` over NVIDIA's FP8 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP8, -3.3-70B-, -3.1-405B-)
# and, on the B200, its NVFP4 ones (nvidia/Llama-3.3-70B-Instruct-FP4, -3.1-405B-), and the requests in each
# dataset (the same page's table).
OVERVIEW_REQUESTS = {(128, 128): 30_000, (128, 2048): 3000, (128, 4096): 1500, (500, 2000): 3000,
                     (1000, 1000): 3000, (1000, 2000): 1500, (2048, 128): 3000, (2048, 2048): 1500,
                     (5000, 500): 1500, (20000, 2000): 1000}
_SHAPES = tuple(OVERVIEW_REQUESTS)
OVERVIEW = {  # (model, gpu, tp, dtype): output tokens/s, in _SHAPES' order
    ("llama-3.1-8b", "h200", 1, "fp8"): (27_911, 26_221, 18_027, 20_770, 17_744, 16_828, 3_538, 12_194, 3_902, 1_804),
    ("llama-3.1-8b", "h100", 1, "fp8"): (28_312, 22_714, 14_325, 17_660, 15_220, 13_899, 3_450, 9_305, 3_459, 1_351),
    ("llama-3.3-70b", "h200", 1, "fp8"): (3_803, 4_336, 2_872, 3_666, 2_909, 2_994, 442, 2_003, 566, 283),
    ("llama-3.3-70b", "h100", 2, "fp8"): (6_378, 6_651, 4_199, 5_222, 4_205, 4_146, 762, 3_082, 898, 437),
    ("llama-3.1-405b", "h200", 8, "fp8"): (3_814, 5_348, 4_741, 4_724, 3_330, 3_722, 456, 2_948, 650, 505),
    ("llama-3.1-405b", "h100", 8, "fp8"): (3_627, 4_340, 3_116, 3_994, 2_919, 2_895, 453, 2_296, 610, 345),
    ("llama-3.3-70b", "b200", 1, "fp4"): (11_147, 9_922, 6_831, 7_762, 7_007, 6_271, 1_339, 4_783, 1_459, 665),
    ("llama-3.1-405b", "b200", 4, "fp4"): (6_281, 8_020, 6_345, 6_244, 5_209, 4_933, 749, 4_212, 1_048, 672),
}
# Bytes per K/V element in each checkpoint's cache. nvidia/Llama-3.1-405B-Instruct-FP8's model card (ModelOpt
# 0.15.1) says only the linear operators' weights and activations in the transformer blocks were quantized,
# so its K/V stays 16-bit, and trtllm-bench sizes the run from that (tuning.py reads the checkpoint's
# kv_cache_quant_algo). The 8B and 70B FP8 checkpoints are taken to carry an FP8 cache (assumed:
# their quantization configs were not read here; at 16 bits their decode-heavy figures would be 34-108 % slow).
# nvidia/Llama-3.3-70B-Instruct-NVFP4 (the FP4 checkpoint renamed) declares kv_cache_quant_algo FP8 in its
# hf_quant_config.json. The 405B FP4 checkpoint's config was not read here: it is taken to keep a 16-bit cache like
# its FP8 sibling (assumed; with an FP8 cache its decode-heavy runs come out 18-26 % fast, with 16 bits within 16 %).
OVERVIEW_KV_BYTES = {("llama-3.1-8b", "fp8"): 1, ("llama-3.3-70b", "fp8"): 1, ("llama-3.1-405b", "fp8"): 2,
                     ("llama-3.3-70b", "fp4"): 1, ("llama-3.1-405b", "fp4"): 2}
# The two B200 runs Blackwell's K/V share and NVFP4 GEMM efficiency are fitted on: one decode-heavy, one prefill-heavy
OVERVIEW_FIT = {("llama-3.3-70b", "b200", 1, "fp4", 128, 4096), ("llama-3.3-70b", "b200", 1, "fp4", 2048, 128)}
# The three release-0.20 runs its host's time per request is fitted on: the decode-heaviest shape with the most rows
# a step (128/2,048) at TP8, where that time weighs most, on each GPU; its 115 other runs are held out
OVERVIEW_V020_FIT = {("llama-3.3-70b", gpu, 8, dtype, 128, 2048) for gpu, dtype in
                     (("h100", "fp8"), ("h200", "fp8"), ("b200", "fp4"))}


def _offline_hw(params: dict[str, float], gpu: str, dtype: str, tp: int, release: str = "1.0") -> Hardware:
    """TensorRT-LLM's PyTorch backend at `release`: the presets as they are (K/V read once per GQA group;
    all-reduces by its own kernels, cpp/tensorrt_llm/kernels/customAllReduceKernels.cu, at one kernel's fixed cost,
    where the NCCL all-reduces of its 2023 releases cost link_latency_s or trtllm05_link_s), TensorRT-LLM's fitted step cost, no
    context-phase cost; and at release 0.20 with tp > 1 its host's time per scheduled request a step that the GPU waits
    for (`trtllm020_seq_s`, fitted on three of its TP8 runs). Not at TP1: there 0.20's published throughputs are
    0.94-1.06 of release 1.0's on the same GPU, and release 1.0's runs show no such cost at any degree
    (docs/perf/sim-vs-published-log.md; the gate was chosen after the 8B TP1 errors were seen)."""
    seq = params["trtllm020_seq_s"] if release == "0.20" and tp > 1 else 0.0
    return fitted_presets(params)[gpu].for_dtype(dtype).with_(step_overhead_s=params["trtllm_step_s"], graph_overhead_s=None,
                                                     seq_overhead_s=seq)


def _offline_cm(model: str, gpu: str, tp: int, dtype: str) -> tuple[CostModel, Hardware]:
    hw = presets()[gpu].for_dtype(dtype)  # the settings read the GPU's memory, no fitted parameter
    return CostModel.for_hardware(PRESETS[model], hw, tp=tp, kv_dtype_bytes=OVERVIEW_KV_BYTES[(model, dtype)]), hw


def offline_predict(model: str, gpu: str, tp: int, dtype: str, isl: int, osl: int,
                    release: str = "1.0") -> Callable[[dict[str, float]], float]:
    def predict(params: dict[str, float]) -> float:
        hw = _offline_hw(params, gpu, dtype, tp, release)
        cm = CostModel.for_hardware(PRESETS[model], hw, tp=tp, kv_dtype_bytes=OVERVIEW_KV_BYTES[(model, dtype)])
        return offline_seconds(cm, hw, isl, osl, OVERVIEW_REQUESTS[(isl, osl)], bench_settings(cm, hw, isl, osl))
    return predict


# The same page at release 0.20 ("The data collected for the v0.20 benchmarks", the version whose note says its runs
# used `use_cuda_graph: true`); None where its table has no figure. Its rows of 1,024/2,048 are left out: the page
# gives no request count for that shape. Where both releases measured one deployment, 0.20's figures are 0.87-1.09
# of 1.0's (docs/perf/sim-vs-published-log.md): the spread a release adds.
OVERVIEW_V020: dict[Deployment, tuple[float | None, ...]] = {
    # the two TP1 deployments release 1.0 measured too (0.94-1.06 of its throughputs): no host time is charged there
    ("llama-3.3-70b", "b200", 1, "fp4"): (10994.48, 9580.46, 6418.39, 7343.32, 6752.53, 6670.07, 1342.17, None,
                                          1429.67, 629.77),
    ("llama-3.3-70b", "h200", 1, "fp8"): (3605.47, 4315.80, 2701.17, 3478.76, 2744.32, 2896.44, 435.90, None, 545.96,
                                          276.66),
    ("llama-3.3-70b", "b200", 2, "fp4"): (17542.11, 15432.35, 9841.53, 11850.57, 10815.88, 9830.73, 1989.41, None,
                                          2419.67, 1177.01),
    ("llama-3.3-70b", "b200", 4, "fp4"): (24667.31, 23568.12, 17808.76, 20709.67, 16413.04, 15597.49, 3033.14, None,
                                          3686.84, 2120.66),
    ("llama-3.3-70b", "b200", 8, "fp4"): (27272.27, 31174.31, 25229.25, 28038.78, 20060.66, 20672.37, 4035.64, None,
                                          5182.96, 3429.03),
    # "Llama 3.1 405B FP4", B200 TP 4, and below "Llama 3.3 70B FP8", H100 TP 2: release 1.0 measured both too (added
    # 2026-12-07: left out before without a stated reason)
    ("llama-3.1-405b", "b200", 4, "fp4"): (6163.81, 7081.21, 6028.37, 5858.75, 4848.00, 5375.25, 693.55, None,
                                           947.49, 641.11),
    ("llama-3.1-405b", "b200", 8, "fp4"): (9002.90, 10288.28, 8713.77, 9125.86, 7582.97, 7626.28, 1086.56, None,
                                           1532.45, 1097.84),
    ("llama-3.3-70b", "h200", 2, "fp8"): (6427.69, 8464.03, 5573.55, 6740.06, 5119.72, 5847.26, 772.67, None, 997.15,
                                          620.33),
    ("llama-3.3-70b", "h200", 4, "fp8"): (10407.42, 13508.59, 11458.56, 12200.18, 8685.44, 9031.21, 1264.76, None,
                                          1698.22, 1161.29),
    ("llama-3.3-70b", "h200", 8, "fp8"): (15434.37, 20759.72, 16668.75, None, 12744.51, 13141.17, None, 10412.85,
                                          2655.28, 1985.85),
    ("llama-3.3-70b", "h100", 1, "fp8"): (3128.33, 756.42, None, None, 742.14, 533.74, None, None, 204.94, None),
    # "Llama 3.3 70B FP8", H100 80GB HBM3 TP 2 (added 2026-12-07)
    ("llama-3.3-70b", "h100", 2, "fp8"): (6216.91, 5782.57, 3868.37, 4684.06, 4247.19, 3866.53, 736.89, None, 862.91,
                                          416.13),
    ("llama-3.3-70b", "h100", 4, "fp8"): (None, 11464.94, 8206.39, 9903.53, 7435.65, 7611.12, 1213.33, None, 1552.68,
                                          903.66),
    ("llama-3.3-70b", "h100", 8, "fp8"): (None, 17424.32, 12624.61, 14553.93, 11018.81, 11139.22, 1839.22, None,
                                          2369.84, 1554.10),
    # "Llama 3.1 8B FP8", H200 141GB HBM3 and H100 80GB HBM3, TP 1 (no 2,048/2,048 row), and "Llama 3.1 405B FP8",
    # H200 and H100, TP 8 (no 128/128 or 2,048/2,048 row): release 1.0 measured all four too (added 2026-12-07: left
    # out before, the fourth session's reason, deployments release 1.0 lacks, dropped since the TP1 columns joined)
    ("llama-3.1-8b", "h200", 1, "fp8"): (27970.14, 23326.38, 17508.51, 21390.41, 17366.89, 16831.31, 3488.03, None,
                                         3813.69, 1696.66),
    ("llama-3.1-8b", "h100", 1, "fp8"): (27688.36, 21841.15, 13730.89, 17833.34, 15270.62, 13798.08, 3414.67, None,
                                         3394.54, 1345.42),
    ("llama-3.1-405b", "h200", 8, "fp8"): (None, 5567.87, 5136.85, 4787.61, 3286.30, 3636.76, 443.10, None, 645.46,
                                           None),
    ("llama-3.1-405b", "h100", 8, "fp8"): (None, None, None, 3673.91, 3012.22, 3262.20, 449.02, None, None, 372.12),
}
# Not here: the page's "Llama 4 Maverick FP8" (nvidia/Llama-4-Maverick-17B-128E-Instruct-FP8, TP 8 on H200 and H100),
# a mixture of experts (128 routed experts, 17B active parameters a token) the simulator cannot price: its cost model
# charges every weight of a dense decoder to every row and has no expert routing, no expert parallelism and no preset.


def offline_kv_share(model: str, gpu: str, tp: int, dtype: str) -> float:
    """The share of the deployment's GPU memory its runtime gives the K/V (`runtime_kv_tokens`, what the prediction
    assumes): 9 % for the 70B on one H100, 31-89 % for every other deployment here."""
    cm, hw = _offline_cm(model, gpu, tp, dtype)
    return bench_settings(cm, hw, 1, 1).kv_tokens * deployment_kv_bytes(cm) / (hw.memory_bytes * tp)


def overview_schedulable(table: dict[Deployment, tuple[float | None, ...]] | None = None
                         ) -> dict[tuple[str, str, int, str, int, int], bool]:
    """Which published offline runs of `table` (default: release 1.0's) the schedule reproduces: a prompt must fit
    the step beside a full batch under trtllm-bench's settings (2,048/2,048, 5,000/500 and 20,000/2,000 mostly do
    not: those runs chunked their context or used settings the page does not give, so they are not predicted)."""
    out = {}
    for (model, gpu, tp, dtype) in (OVERVIEW if table is None else table):
        cm, hw = _offline_cm(model, gpu, tp, dtype)
        for isl, osl in _SHAPES:
            out[(model, gpu, tp, dtype, isl, osl)] = schedulable(bench_settings(cm, hw, isl, osl), isl, osl)
    return out


def offline_runs(table: dict[Deployment, tuple[float | None, ...]]
                 ) -> list[tuple[Deployment, int, int, float]]:
    """(deployment, isl, osl, output tokens/s) of every figure of `table` the schedule reproduces."""
    ok = overview_schedulable(table)
    return [(dep, isl, osl, tok_s) for dep, rates in table.items()
            for (isl, osl), tok_s in zip(_SHAPES, rates, strict=True) if tok_s is not None and ok[(*dep, isl, osl)]]
