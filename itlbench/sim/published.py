"""Published GPU measurements, the simulator's prediction of each, and the fit of its efficiencies.

Every figure names the public file it comes from. Three kinds of measurement, from three software
stacks, so the fit separates what belongs to the GPU (kernel efficiencies, shared by all) from what
belongs to the engine (fixed costs per step and per sequence, one set per source):

- Sarathi-Serve's artifact (microsoft/sarathi-serve, osdi-experiments/): Yi-34B-200K, fp16, TP2 on two
  A100 80GB PCIe. figure-2/prefill.csv (one prompt per batch, batch_execution_time), figure-2/decode.csv
  (batches of 1,020-token sequences after their prompt, per operation_time_split_runs.sh), and
  figure-9/chunking-overhead.csv (a whole prefill in chunks of 512 / 1,024 / 2,048 tokens). Its
  prototype runs eagerly (no CUDA graphs): its own step and sequence overheads are fitted.
- Vidur's operator profiles (microsoft/vidur, data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/
  mlp.csv): one layer's GEMMs of Llama-3-8B on an A100 (median ms), kernel times with no engine around;
  and the same repository's Llama-2-7B and -70B profiles on the A100 and the H100 at TP1-8, summed per
  layer (they fix Hopper's bandwidth gain and check the H100's assumed bf16 GEMM efficiency).
- TensorRT-LLM's published first-token latencies (NVIDIA/TensorRT-LLM, docs/source/performance.md):
  Llama-2 at batch 1, 128 and 2,048 input tokens, and its static-batch throughputs; that engine's fitted
  fixed costs (per step, more per step that carries prompt work: its context phase, and per generate call at
  TP > 1); the same page's static batches at release 0.5.0; each of the two 2023 releases (0.5 and 0.6.1) its
  own GQA decode re-read and all-reduce fixed cost; and docs/source/performance/perf-overview.md, releases 1.0's and
  0.20's offline throughputs of fixed-length datasets, predicted through trtllm-bench's settings and an
  in-flight schedule (sim/trtllm_bench.py; the tables: sim/published_offline.py), all held out but two
  B200 runs that fix Blackwell's terms and three release-0.20 runs that fix that release's host time per
  request a step.
- vLLM's own performance benchmark (Buildkite pipeline vllm/performance-benchmark): its latency tests,
  one batch of 8 prompts of 32 tokens generating 128, on H200, A100 and H100 — predicted with the presets
  exactly as `--engine sim` runs them, so they check the vLLM-like step costs the presets assume.

`FIGURES` marks each figure fit or held out; `fit` finds the parameters on the fit set alone, so the
held-out errors are predictions. The 256-token row of prefill.csv (121 ms, slower than 512 tokens; its
batch id 0 is the run's first, a warm-up) is left out and said so in the docs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from itlbench.core.presets import PRESETS
from itlbench.sim.hardware import FIT, Hardware
from itlbench.sim.operators import gemm_seconds
from itlbench.sim.published_offline import (  # noqa: F401 (re-exported: the offline tables and their check)
    OVERVIEW,
    OVERVIEW_FIT,
    OVERVIEW_KV_BYTES,
    OVERVIEW_REQUESTS,
    OVERVIEW_V020,
    OVERVIEW_V020_FIT,
    fitted_presets,
    offline_kv_share,
    offline_predict,
    offline_runs,
    overview_schedulable,
)
from itlbench.sim.roofline import CostModel, StepShape

SARATHI = "microsoft/sarathi-serve"
VIDUR = "microsoft/vidur"
TRTLLM = "NVIDIA/TensorRT-LLM"
S_PREFILL = "osdi-experiments/figure-2/prefill.csv"
S_DECODE = "osdi-experiments/figure-2/decode.csv"
S_CHUNK = "osdi-experiments/figure-9/chunking-overhead.csv"
V_MLP = "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
T_PERF = "docs/source/performance.md"
T_OVERVIEW = "docs/source/performance/perf-overview.md"
VLLM_CI = "buildkite.com/vllm/performance-benchmark"
DECODE_BLOCK = 32
DECODE_CONTEXT = 1022  # 1,020-token prompts (prefill_to_decode_ratio 255 of 1,024) plus the tokens decoded

# Engine fixed costs: fitted alongside the kernel efficiencies, one set per source's engine.
ENGINE_PARAMS = {"sarathi_step_s": 0.0142, "sarathi_seq_s": 0.0008617, "sarathi_attn_eff": 0.1505,
                 "sarathi_decode_switch_s": 0.01614, "trtllm_step_s": 0.0003093, "trtllm_context_s": 0.002145,
                 "trtllm_gqa_reread": 0.5462, "trtllm020_seq_s": 1.374e-05, "trtllm_call_s": 0.005062,
                 "trtllm05_link_s": 3.323e-05, "trtllm05_gqa_reread": 0.9695}
# Held at its stored value by `fit`: since release 0.5 took its own all-reduce cost, no fit figure separates
# link_latency_s from release 0.6.1's GQA re-read (one figure fixes both) and Sarathi-Serve's step cost (every step
# of its runs pays the same 120 all-reduces).
HELD = ("link_latency_s",)
SARATHI_SMALL_DECODE = 4  # decode batches of up to this many sequences run without the switch cost
KERNEL_PARAMS = ("gemm_eff_a100", "gemm_eff_a100_pcie", "fp8_gemm_eff_h100", "fp8_gemm_eff_ada", "gemm_m_half",
                 "attn_eff",
                 "mem_eff", "attn_mem_eff", "kernel_s", "link_eff", "roof_blend", "link_latency_s", "hopper_mem_gain",
                 "blackwell_kv_gain", "fp4_gemm_eff_blackwell")


@dataclass(frozen=True)
class Figure:
    key: str
    repo: str
    path: str
    what: str
    measured_s: float
    fit: bool
    predict: Callable[[dict[str, float]], float]
    gpu: str  # the preset the figure tests (sim/hardware.py), and the number format its GEMMs ran in
    dtype: str
    tp: int  # the degree of tensor parallelism it ran at
    kv_share: float | None = None  # share of GPU memory the prediction gives the K/V (engine runs that fill it)


def _gpus(params: dict[str, float]) -> dict[str, Hardware]:
    return fitted_presets(params)


def _sarathi_hw(params: dict[str, float]) -> Hardware:
    return _gpus(params)["a100-pcie"].with_(dtype="float16", step_overhead_s=params["sarathi_step_s"],
                                            graph_overhead_s=None, seq_overhead_s=params["sarathi_seq_s"],
                                            link_latency_s=params["link_latency_s"])  # NCCL's (2023)


def _sarathi_steps(params: dict[str, float], shapes: list[StepShape]) -> float:
    """Sarathi-Serve's prototype attends a prompt with no cached prefix with another kernel than a chunk
    after a cached prefix (or a decode): the first gets its own fitted efficiency."""
    hw = _sarathi_hw(params)
    fresh = hw.with_(attn_eff=params["sarathi_attn_eff"])
    cm = CostModel.for_hardware(PRESETS["yi-34b"], hw, tp=2, cuda_graphs=False)
    return sum(cm.time(s, fresh if s.context_tokens == 0 else hw).total_s + _decode_switch_s(params, s)
               for s in shapes)


def _decode_switch_s(params: dict[str, float], shape: StepShape) -> float:
    """decode.csv's step between 4 and 8 sequences (48.9 -> 69.7 ms, then about 1 ms a sequence as before):
    a fixed cost of the prototype's decode steps past SARATHI_SMALL_DECODE sequences, not a slope. A
    kernel or code-path switch the artifact does not isolate; its size is fitted (one figure, batch 8)."""
    decode_only = shape.tokens == shape.sequences
    return params["sarathi_decode_switch_s"] if decode_only and shape.sequences > SARATHI_SMALL_DECODE else 0.0


def _chunks(length: int, chunk: int) -> list[StepShape]:
    starts = range(0, length, chunk)
    return [StepShape.of([(min(chunk, length - p), p, p + chunk >= length)]) for p in starts]


def _vidur(name: str, rows: int, tp: int) -> Callable[[dict[str, float]], float]:
    def predict(params: dict[str, float]) -> float:
        hw = _gpus(params)["a100"].with_(dtype="float16")
        return gemm_seconds(CostModel.for_hardware(PRESETS["llama-3-8b"], hw, tp=tp), name, rows, hw)
    return predict


# Vidur's operator profiles of Llama-2-7B and -70B on the A100 and the H100 (microsoft/vidur,
# data/profiling/compute/{gpu}/meta-llama/Llama-2-{7b,70b}-hf/mlp.csv, fp16): one layer's four GEMMs
# (attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj; the sum of their median ms, rows profiled
# twice averaged) at every power of 4 from 1 to 4,096 rows, on one GPU of TP1-8. A layer's sum, not each
# kernel: a step pays for the layer, and single kernels carry cuBLAS's choice of tile for their shape
# (the H100's 70B down projection takes 3.1x at 1,024 rows what it takes at 512). The two 1-row TP1
# layers on the H100 (a layer's weights read once) are fitted, for hopper_mem_gain; the rest are held out.
VIDUR_ROWS = (1, 4, 16, 64, 256, 1024, 4096)
VIDUR_LAYERS = {  # (gpu, model, tp): ms at each of VIDUR_ROWS
    ("a100", "llama-2-7b", 1): (0.266, 0.259, 0.263, 0.278, 0.5025, 1.959, 7.445),
    ("a100", "llama-2-7b", 2): (0.136, 0.139, 0.141, 0.148, 0.292, 0.905, 3.5495),
    ("a100", "llama-2-7b", 4): (0.08, 0.082, 0.083, 0.087, 0.177, 0.475, 1.7403),
    ("a100", "llama-2-7b", 8): (0.052, 0.053, 0.054, 0.058, 0.097, 0.262, 0.9605),
    ("a100", "llama-2-70b", 1): (1.072, 1.086, 1.1145, 1.125, 2.1165, 8.128, 29.4258),
    ("a100", "llama-2-70b", 2): (0.529, 0.536, 0.549, 0.5925, 1.058, 4.1345, 14.6895),
    ("a100", "llama-2-70b", 4): (0.284, 0.2905, 0.3025, 0.3075, 0.588, 2.1155, 7.263),
    ("a100", "llama-2-70b", 8): (0.152, 0.155, 0.16, 0.166, 0.3355, 1.012, 3.6768),
    ("h100", "llama-2-7b", 1): (0.156, 0.152, 0.1605, 0.162, 0.26, 0.565, 2.2135),
    ("h100", "llama-2-7b", 2): (0.085, 0.084, 0.088, 0.0935, 0.1235, 0.311, 1.1012),
    ("h100", "llama-2-7b", 4): (0.0505, 0.05, 0.051, 0.057, 0.076, 0.1865, 0.5713),
    ("h100", "llama-2-7b", 8): (0.029, 0.0345, 0.035, 0.038, 0.0535, 0.108, 0.317),
    ("h100", "llama-2-70b", 1): (0.593, 0.575, 0.581, 0.5995, 0.719, 2.759, 10.163),
    ("h100", "llama-2-70b", 2): (0.294, 0.295, 0.298, 0.31, 0.3755, 1.327, 4.9278),
    ("h100", "llama-2-70b", 4): (0.159, 0.164, 0.1605, 0.17, 0.215, 0.688, 2.3765),
    ("h100", "llama-2-70b", 8): (0.0875, 0.0865, 0.0885, 0.093, 0.121, 0.332, 1.1747),
}
VIDUR_LAYER_FIT = {("h100", "llama-2-7b", 1, 1), ("h100", "llama-2-70b", 1, 1)}


def _vidur_layer(gpu: str, model: str, tp: int, rows: int) -> Callable[[dict[str, float]], float]:
    def predict(params: dict[str, float]) -> float:
        hw = _gpus(params)[gpu].with_(dtype="float16")
        cm = CostModel.for_hardware(PRESETS[model], hw, tp=tp)
        return sum(gemm_seconds(cm, name, rows, hw) for name in ("qkv", "o", "gate_up", "down"))
    return predict


def _ttft(model: str, gpu: str, dtype: str, tp: int, prompt: int) -> Callable[[dict[str, float]], float]:
    """Release 0.5's first token: a generate call of one context step (gptSessionBenchmark, output 1)."""
    def predict(params: dict[str, float]) -> float:
        hw = _trt_hw(params, gpu, dtype, "0.5")
        step = CostModel.for_hardware(PRESETS[model], hw, tp=tp).time(StepShape.prefill(prompt), hw).total_s
        return step + _call_s(params, tp)
    return predict


def _call_s(params: dict[str, float], tp: int) -> float:
    """gptSessionBenchmark's fixed cost a generate call at TP > 1 (its ranks, started under mpirun, meet once a
    call): what lets release 0.5's first tokens and its decode steps share one all-reduce cost."""
    return params["trtllm_call_s"] if tp > 1 else 0.0


def _trt_hw(params: dict[str, float], gpu: str, dtype: str, release: str) -> Hardware:
    """TensorRT-LLM's 2023 releases (0.5, 0.6.1): the presets' kernels, its own fitted step cost, no per-sequence
    cost; each release its own GQA decode re-read and NCCL all-reduce fixed cost (0.6.1's shared with Sarathi-Serve)."""
    v05 = release == "0.5"
    return _gpus(params)[gpu].for_dtype(dtype).with_(
        step_overhead_s=params["trtllm_step_s"], graph_overhead_s=None, seq_overhead_s=0.0,
        gqa_kv_reread=params["trtllm05_gqa_reread" if v05 else "trtllm_gqa_reread"],
        prefill_overhead_s=params["trtllm_context_s"],
        link_latency_s=params["trtllm05_link_s" if v05 else "link_latency_s"])


def _static_batch(model: str, gpu: str, dtype: str, tp: int, batch: int, isl: int, osl: int,
                  release: str) -> Callable[[dict[str, float]], float]:
    """gptSessionBenchmark's static batch: every prompt prefilled in one step, then osl - 1 decode steps."""
    def predict(params: dict[str, float]) -> float:
        hw = _trt_hw(params, gpu, dtype, release)
        cm = CostModel.for_hardware(PRESETS[model], hw, tp=tp)
        prefill = cm.time(StepShape.of([(isl, 0, True)] * batch), hw).total_s
        # the decode steps' time is linear in the context between kernel-shape changes: each block of
        # DECODE_BLOCK steps is charged at its middle step (exact for a linear cost, 30x fewer calls)
        blocks = [(lo, min(lo + DECODE_BLOCK, osl)) for lo in range(1, osl, DECODE_BLOCK)]
        return _call_s(params, tp) + prefill + sum(
            (hi - lo) * cm.time(StepShape.decode(batch, isl + (lo + hi - 1) // 2), hw).total_s for lo, hi in blocks)
    return predict


# TensorRT-LLM docs/source/performance.md: "Peak Throughput" (v0.6.1; L40S v0.5), out tok/s per GPU
# (L40S: per deployment, TP1), and "Low Latency" first-token latencies (v0.5), batch 1.
TRT_THROUGHPUT = (  # gpu, dtype, model, batch, tp, isl, osl, output tokens/s (per GPU)
    ("h100", "fp8", "llama-2-7b", 768, 1, 128, 128, 19_694), ("h100", "fp8", "llama-2-7b", 112, 1, 128, 2048, 6_818),
    ("h100", "fp8", "llama-2-7b", 80, 1, 2048, 128, 2_244), ("h100", "fp8", "llama-2-7b", 48, 1, 2048, 2048, 2_740),
    ("h100", "fp8", "llama-2-70b", 1024, 2, 128, 128, 2_657), ("h100", "fp8", "llama-2-70b", 480, 4, 128, 2048, 1_486),
    ("h100", "fp8", "llama-2-70b", 96, 2, 2048, 128, 306), ("h100", "fp8", "llama-2-70b", 64, 2, 2048, 2048, 547),
    ("l40s", "fp8", "llama-2-7b", 64, 1, 128, 128, 3_240), ("l40s", "fp8", "llama-2-7b", 64, 1, 128, 2048, 1_622),
    ("l40s", "fp8", "llama-2-7b", 32, 1, 2048, 128, 581), ("l40s", "fp8", "llama-2-7b", 16, 1, 2048, 2048, 531),
    ("a100", "float16", "llama-2-7b", 384, 1, 128, 128, 5_586), ("a100", "float16", "llama-2-7b", 60, 1, 128, 2048, 1_928),
    ("a100", "float16", "llama-2-7b", 52, 1, 2048, 128, 591), ("a100", "float16", "llama-2-7b", 64, 2, 2048, 2048, 782),
    ("a100", "float16", "llama-2-70b", 1280, 4, 128, 128, 670), ("a100", "float16", "llama-2-70b", 240, 4, 128, 2048, 525),
    ("a100", "float16", "llama-2-70b", 120, 4, 2048, 128, 79),
)
# The same page at release 0.5.0 ("High Throughput", H100 FP8, out tok/s per deployment): the static batches
# of the release whose first-token latencies are fitted above; all held out.
TRT_THROUGHPUT_V05 = (  # model, batch, tp, isl, osl, output tokens/s
    ("llama-2-7b", 64, 1, 128, 128, 9_193), ("llama-2-7b", 64, 1, 128, 2048, 5_367),
    ("llama-2-7b", 64, 1, 2048, 128, 2_058), ("llama-2-7b", 32, 1, 2048, 2048, 2_230),
    ("llama-2-70b", 64, 4, 128, 128, 3_317), ("llama-2-70b", 64, 4, 128, 2048, 2_616),
    ("llama-2-70b", 64, 4, 2048, 128, 843), ("llama-2-70b", 64, 4, 2048, 2048, 1_583),
)
# The one throughput figure fitted: it alone fixes trtllm_gqa_reread (GQA decode at long context); the
# other two 70B long-output batches (TP4 on H100 and on A100) stay held out to test it.
THROUGHPUT_FIT = {("llama-2-70b", "h100", 2, 64)}
# Release 0.5's two 70B long-output batches, fitted: their decode steps at about 1,150 and 3,070 tokens of context
# separate that release's GQA re-read from its all-reduce fixed cost (its first tokens fix only their sum with the
# call cost); its short batch (64 x 128/128), its prefill-heavy one and the TP4 first tokens stay held out.
THROUGHPUT_V05_FIT = {("llama-2-70b", 128, 2048), ("llama-2-70b", 2048, 2048)}
TRT_TTFT = (  # gpu, dtype, model, tp, input, ms, in the fit set
    ("a100", "float16", "llama-2-7b", 1, 2048, 133.0, True), ("h100", "fp8", "llama-2-7b", 1, 2048, 36.0, True),
    ("a100", "float16", "llama-2-70b", 4, 2048, 377.0, False), ("a100", "float16", "llama-2-7b", 1, 128, 16.0, False),
    ("a100", "float16", "llama-2-70b", 4, 128, 47.0, True), ("h100", "fp8", "llama-2-7b", 1, 128, 7.0, True),
    ("h100", "fp8", "llama-2-70b", 4, 128, 26.0, False), ("h100", "fp8", "llama-2-70b", 4, 2048, 109.0, False),
    ("l40s", "fp8", "llama-2-7b", 1, 128, 14.0, False), ("l40s", "fp8", "llama-2-7b", 1, 2048, 73.0, True),
)


# vLLM's performance benchmark, "Latency tests" (input 32 tokens, output 128, batch 8; bf16; end-to-end
# mean latency of one `generate`): build, GPU as the page names it, and the figure. "llama-3 70B" has the
# shapes of the llama-3.3-70b preset.
VLLM_LATENCY = (  # model, gpu, tp, mean latency ms, build
    ("llama-3.1-8b", "h200", 1, 834.059, 9513), ("llama-3.3-70b", "h200", 4, 2075.08, 9513),
    ("llama-3.1-8b", "a100", 1, 1579.27, 9523), ("llama-3.3-70b", "a100", 4, 3990.59, 9523),
    ("llama-3.1-8b", "h100", 1, 997.542, 9555), ("llama-3.3-70b", "h100", 4, 2444.47, 9555),
)
VLLM_BATCH, VLLM_INPUT, VLLM_OUTPUT = 8, 32, 128


def _vllm_latency(model: str, gpu: str, tp: int) -> Callable[[dict[str, float]], float]:
    """One `generate` of the latency test: the batch's prompts in one step, then output - 1 decode steps
    (replayed as CUDA graphs), on the preset as `--engine sim` runs it: its assumed vLLM-like step costs."""
    def predict(params: dict[str, float]) -> float:
        hw = _gpus(params)[gpu].for_dtype("bfloat16")
        cm = CostModel.for_hardware(PRESETS[model], hw, tp=tp)
        prefill = cm.time(StepShape.of([(VLLM_INPUT, 0, True)] * VLLM_BATCH), hw).total_s
        return prefill + sum(cm.time(StepShape.decode(VLLM_BATCH, VLLM_INPUT + i), hw).total_s
                             for i in range(VLLM_OUTPUT - 1))
    return predict


def _figures() -> list[Figure]:
    out: list[Figure] = []
    prefill = {128: 48.09, 512: 105.58, 1024: 214.30, 2048: 366.03, 4096: 757.60, 8192: 1863.26, 16384: 4407.50}
    for n, ms in prefill.items():
        out.append(Figure(f"sarathi prefill {n}", SARATHI, S_PREFILL, f"Yi-34B TP2 A100-PCIe fp16, prefill of {n}",
                          ms / 1e3, n in (512, 2048, 8192),
                          lambda p, n=n: _sarathi_steps(p, [StepShape.prefill(n)]), "a100-pcie", "float16", 2))
    decode = {1: 46.80, 2: 47.50, 4: 48.85, 8: 69.68, 16: 77.25, 32: 87.90, 64: 127.81, 128: 189.33}
    for b, ms in decode.items():
        out.append(Figure(f"sarathi decode {b}", SARATHI, S_DECODE, f"Yi-34B TP2 A100-PCIe fp16, decode batch {b} "
                          f"at {DECODE_CONTEXT} context", ms / 1e3, b in (1, 8, 32, 128),
                          lambda p, b=b: _sarathi_steps(p, [StepShape.decode(b, DECODE_CONTEXT)]), "a100-pcie",
                          "float16", 2))
    chunked = {(2047, 512): 435.68, (2047, 1024): 444.17, (2047, 2048): 377.71, (4095, 512): 921.96,
               (4095, 1024): 932.26, (4095, 2048): 793.90, (8191, 512): 1958.53, (8191, 1024): 1946.24,
               (8191, 2048): 1643.37, (16383, 512): 4512.83, (16383, 1024): 4357.55, (16383, 2048): 3651.59,
               # the file's unchunked baselines (chunk 16,384): the whole prompt in one step, the quantity
               # prefill.csv measured in another run (366 / 758 / 1,863 / 4,408 ms at 2k-16k)
               (2047, 16384): 378.13, (4095, 16384): 775.44, (8191, 16384): 1754.16, (16383, 16384): 4535.00}
    for (n, c), ms in chunked.items():
        out.append(Figure(f"sarathi chunked {n}/{c}", SARATHI, S_CHUNK, f"Yi-34B TP2, prefill of {n} in chunks "
                          f"of {c}", ms / 1e3, (n, c) in ((4095, 1024), (16383, 2048)),
                          lambda p, n=n, c=c: _sarathi_steps(p, _chunks(n, c)), "a100-pcie", "float16", 2))
    # mlp.csv at microsoft/vidur 7d47513 (file from 2bb7a08): median ms of attn_pre_proj, attn_post_proj, mlp_up_proj,
    # mlp_down_proj. Vidur's profiler lists 8,192 and 32,768 tokens twice (the ends of two ranges of its token grid,
    # two runs); these take the first row of each pair (csv lines 132, 2 and 458), the 8,192 one read from the
    # second (line 133) until the audit of 2026-12-07. The Llama-2 layers below average the pair instead.
    vidur = {(1, 1): (0.033, 0.025, 0.142, 0.076), (128, 1): (0.043, 0.032, 0.191, 0.111),
             (8192, 1): (1.986, 1.252, 8.161, 4.152), (32768, 1): (7.2595, 4.926, 33.094, 16.6075),
             (32768, 2): (3.860, 2.6375, 17.389, 7.873)}
    for (rows, tp), times in vidur.items():
        for name, ms in zip(("qkv", "o", "gate_up", "down"), times, strict=True):
            out.append(Figure(f"vidur {name} {rows}" + (f" tp{tp}" if tp > 1 else ""), VIDUR, V_MLP,
                              f"Llama-3-8B layer GEMM {name}, {rows} rows, A100, TP{tp}", ms / 1e3,
                              rows in (1, 128, 32768) and tp == 1, _vidur(name, rows, tp), "a100", "float16", tp))
    for (gpu, model, tp), times in VIDUR_LAYERS.items():
        hf = {"llama-2-7b": "Llama-2-7b-hf", "llama-2-70b": "Llama-2-70b-hf"}[model]
        for rows, ms in zip(VIDUR_ROWS, times, strict=True):
            out.append(Figure(f"vidur layer {model} {gpu} tp{tp} {rows}", VIDUR,
                              f"data/profiling/compute/{gpu}/meta-llama/{hf}/mlp.csv",
                              f"{model} one layer's four GEMMs, {rows} rows, {gpu} fp16, TP{tp}", ms / 1e3,
                              (gpu, model, tp, rows) in VIDUR_LAYER_FIT, _vidur_layer(gpu, model, tp, rows), gpu,
                              "float16", tp))
    for gpu, dtype, model, tp, isl, ms, fit in TRT_TTFT:
        out.append(Figure(f"trtllm ttft {model} {gpu} {dtype} tp{tp} {isl}", TRTLLM, T_PERF,
                          f"TensorRT-LLM {model} TTFT, batch 1, {isl} input, {gpu} {dtype} TP{tp}", ms / 1e3, fit,
                          _ttft(model, gpu, dtype, tp, isl), gpu, dtype, tp))
    for gpu, dtype, model, batch, tp, isl, osl, tok_s in TRT_THROUGHPUT:
        per_gpu = gpu != "l40s"
        seconds = batch * osl / (tok_s * (tp if per_gpu else 1))
        out.append(Figure(f"trtllm batch {model} {gpu} {dtype} tp{tp} {batch}x{isl}/{osl}", TRTLLM, T_PERF,
                          f"TensorRT-LLM {model} static batch {batch} x {isl}/{osl} on {gpu} {dtype} TP{tp} "
                          f"({tok_s:,} out tok/s{'/GPU' if per_gpu else ''})", seconds,
                          (model, gpu, tp, batch) in THROUGHPUT_FIT,
                          _static_batch(model, gpu, dtype, tp, batch, isl, osl, "0.5" if gpu == "l40s" else "0.6.1"),
                          gpu, dtype, tp))
    for model, batch, tp, isl, osl, tok_s in TRT_THROUGHPUT_V05:
        out.append(Figure(f"trtllm v0.5 batch {model} h100 fp8 tp{tp} {batch}x{isl}/{osl}", TRTLLM, T_PERF,
                          f"TensorRT-LLM v0.5 {model} static batch {batch} x {isl}/{osl} on h100 fp8 TP{tp} "
                          f"({tok_s:,} out tok/s)", batch * osl / tok_s,
                          (model, isl, osl) in THROUGHPUT_V05_FIT,
                          _static_batch(model, "h100", "fp8", tp, batch, isl, osl, "0.5"), "h100", "fp8", tp))
    for release, table, fitted in (("1.0", OVERVIEW, OVERVIEW_FIT), ("0.20", OVERVIEW_V020, OVERVIEW_V020_FIT)):
        tag = "trtllm1" if release == "1.0" else "trtllm0.20"
        for (model, gpu, tp, dtype), isl, osl, tok_s in offline_runs(table):
            n = OVERVIEW_REQUESTS[(isl, osl)]
            out.append(Figure(f"{tag} offline {model} {gpu} {dtype} tp{tp} {isl}/{osl}", TRTLLM, T_OVERVIEW,
                              f"TensorRT-LLM {release} {model} offline {n:,} x {isl}/{osl} on {gpu} {dtype} TP{tp} "
                              f"({tok_s:,} out tok/s)", n * osl / tok_s,
                              (model, gpu, tp, dtype, isl, osl) in fitted,
                              offline_predict(model, gpu, tp, dtype, isl, osl, release),
                              gpu, dtype, tp, offline_kv_share(model, gpu, tp, dtype)))
    for model, gpu, tp, ms, build in VLLM_LATENCY:
        out.append(Figure(f"vllm latency {model} {gpu} bf16 tp{tp}", VLLM_CI, f"builds/{build}",
                          f"vLLM latency test {model} {VLLM_BATCH} x {VLLM_INPUT}/{VLLM_OUTPUT} on {gpu} bf16 TP{tp}",
                          ms / 1e3, False, _vllm_latency(model, gpu, tp), gpu, "bfloat16", tp))
    return out


FIGURES: list[Figure] = _figures()


def default_params() -> dict[str, float]:
    return {**{k: FIT[k] for k in KERNEL_PARAMS}, **ENGINE_PARAMS}


def errors(params: dict[str, float], figures: list[Figure] | None = None) -> list[tuple[Figure, float, float]]:
    """(figure, predicted seconds, signed relative error) for each figure."""
    return [(f, pred, pred / f.measured_s - 1.0) for f in (figures or FIGURES) for pred in (f.predict(params),)]


def mape(rows: list[tuple[Figure, float, float]]) -> float:
    return float(np.mean([abs(e) for *_, e in rows])) if rows else math.nan


_EFFS = ("gemm_eff_a100", "gemm_eff_a100_pcie", "fp8_gemm_eff_h100", "fp8_gemm_eff_ada", "fp4_gemm_eff_blackwell", "attn_eff", "mem_eff", "attn_mem_eff",
         "link_eff", "sarathi_attn_eff", "trtllm_gqa_reread", "trtllm05_gqa_reread")


def _unpack(x: np.ndarray, names: list[str]) -> dict[str, float]:
    """Efficiencies through a logistic (kept in (0, 1)), everything else through exp (kept positive)."""
    return {n: float(1 / (1 + np.exp(-v)) if n in _EFFS else np.exp(v)) for n, v in zip(names, x, strict=True)}


def _pack(params: dict[str, float], names: list[str]) -> np.ndarray:
    return np.array([math.log(params[n] / (1 - params[n])) if n in _EFFS else math.log(params[n]) for n in names])


def fit(start: dict[str, float] | None = None, rounds: int = 3) -> dict[str, float]:
    """Parameters minimising the mean absolute relative error over the fit set (held-out figures unseen); those
    in HELD keep their values."""
    from itlbench.sim.calibrate import _nelder_mead

    params = dict(start or default_params())
    names = [n for n in params if n not in HELD]
    fit_set = [f for f in FIGURES if f.fit]

    def loss(x: np.ndarray) -> float:
        p = params | _unpack(x, names)
        return float(np.mean([abs(f.predict(p) / f.measured_s - 1.0) for f in fit_set]))

    x = _pack(params, names)
    for r in range(rounds):
        x = _nelder_mead(loss, x, step=0.3 if r == 0 else 0.1, iters=1500)
    return params | _unpack(x, names)
