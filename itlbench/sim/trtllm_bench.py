"""TensorRT-LLM's offline throughput runs (`trtllm-bench throughput`), predicted with the cost model.

TensorRT-LLM's performance overview (NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md)
publishes the output tokens/s of fixed-length datasets (every request `isl` prompt and `osl` output
tokens) queued at once on Llama-3.1-8B and Llama-3.3-70B in FP8. Unlike a static batch, the engine
batches in flight, so predicting those figures needs its settings and its schedule, not just a step:

- settings: trtllm-bench picks the engine's max batch size and max tokens per step from an estimate of the K/V room
  (tensorrt_llm/bench/build/tuning.py, calc_engine_setting and finetune_setting, restated here), and the runtime
  then gives the K/V its fraction of what is really left (`runtime_kv_tokens`): `bench_settings`;
- schedule: each request reserves K/V for its whole isl + osl (the default GUARANTEED_NO_EVICT
  capacity policy), decoding rows are scheduled first, and whole prompts fill what is left of the step's
  token budget (no chunked context): `offline_seconds`.

Requests of one shape admitted in one step move in lockstep, so the run is simulated by cohorts, and a
stretch of decode-only steps (the same rows, the context growing by one a row a step) is charged at its
middle step: exact where a step's cost is linear in context, as its K/V read is. Torch-free.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from itlbench.sim.memory import reserve_bytes
from itlbench.sim.profile import Hardware
from itlbench.sim.roofline import CostModel
from itlbench.sim.shapes import StepShape

GIB = 1024 ** 3
KV_FRACTION = 0.95  # the page's `--kv_cache_free_gpu_mem_fraction 0.95` ("in many cases")
KV_BLOCK = 32  # tokens per K/V block (TensorRT-LLM's default tokens_per_block)
# Bytes a weight takes in the heuristic's estimate of the engine's size (tuning.py's BYTES_PER_ELEM: every
# parameter at the quantized width, NVFP4 at half a byte without its scales or its 16-bit tables)
ESTIMATE_BYTES = {"fp8": 1.0, "fp4": 0.5}


@dataclass(frozen=True)
class BenchSettings:
    max_batch_size: int
    max_num_tokens: int
    kv_tokens: int  # tokens of K/V the deployment holds


def bench_settings(cm: CostModel, hw: Hardware, isl: int, osl: int, kv_fraction: float = KV_FRACTION) -> BenchSettings:
    """trtllm-bench's settings for a model in `hw`'s dtype (weights at `ESTIMATE_BYTES`, 16-bit otherwise; K/V at
    the cost model's bytes, which the heuristic reads from the checkpoint's `kv_cache_quant_algo`) on tp GPUs, and
    the K/V the runtime then allocates."""
    kv_per_token = deployment_kv_bytes(cm) / GIB
    engine = cm.params * ESTIMATE_BYTES.get(hw.dtype, 2.0) / GIB
    cache = (hw.memory_bytes * cm.tp / GIB - engine) * kv_fraction
    requests = cache / (kv_per_token * (isl + osl))
    raw_bs = min(requests, 4096)
    max_num_tokens = _round_tokens(min(raw_bs * (1 + isl / osl), 32768))
    return BenchSettings(_round_batch(raw_bs), max_num_tokens, runtime_kv_tokens(cm, hw, max_num_tokens, kv_fraction))


def runtime_kv_tokens(cm: CostModel, hw: Hardware, max_num_tokens: int, kv_fraction: float = KV_FRACTION) -> int:
    """Tokens of K/V the PyTorch runtime allocates: `kv_fraction` of what each GPU has left once it holds its weights
    (16-bit tables included) and has run a profiling step of `max_num_tokens` (tensorrt_llm/_torch/pyexecutor/
    _util.py: (total - peak) x fraction), its reserve (sim/memory.py) kept. The heuristic's estimate skips the tables
    and the reserve, which made the 70B on one H100 a third fast (docs/perf/sim-vs-published.md)."""
    left = hw.memory_bytes - cm.weight_bytes_per_gpu - reserve_bytes(cm.tp, cm.model.hidden_size, max_num_tokens)
    return int(max(0.0, left) * kv_fraction * cm.tp / deployment_kv_bytes(cm))


def deployment_kv_bytes(cm: CostModel) -> float:
    """K/V bytes one token takes across the tp GPUs: each holds its heads' share, whole heads copied past the K/V
    head count."""
    m = cm.model
    return cm.kv_bytes_per_token * max(cm.tp, m.num_kv_heads) / m.num_kv_heads


def _round_batch(raw: float) -> int:
    if raw < 256:
        return max(64, 32 * math.ceil(raw / 32))
    return 128 * math.ceil(raw / 128) if raw < 1024 else 256 * math.ceil(raw / 256)


def _round_tokens(raw: float) -> int:
    if raw < 4096:
        return max(2048, 256 * math.ceil(raw / 256))
    return 512 * math.ceil(raw / 512) if raw < 8192 else 1024 * math.ceil(raw / 1024)


def schedulable(settings: BenchSettings, isl: int, osl: int) -> bool:
    """Whether a whole prompt fits the step beside the rows of a full batch less the request it replaces:
    where it does not, the run needed chunked context or other settings, which the page does not state."""
    room = _room(settings, isl, osl)
    return room >= 1 and isl + room - 1 <= settings.max_num_tokens


def _room(settings: BenchSettings, isl: int, osl: int) -> int:
    """Requests in flight at once: the batch limit, or the K/V each reserves for isl + osl in whole blocks."""
    return min(settings.max_batch_size, settings.kv_tokens // (-(-(isl + osl) // KV_BLOCK) * KV_BLOCK))


def offline_seconds(cm: CostModel, hw: Hardware, isl: int, osl: int, requests: int, settings: BenchSettings) -> float:
    """Seconds to serve `requests` requests of isl/osl queued at once, in flight, under `settings`."""
    if not schedulable(settings, isl, osl):
        raise ValueError(f"{isl}/{osl}: a prompt does not fit beside the decoding rows under {settings}")
    room = _room(settings, isl, osl)
    waiting, seconds, steps = requests, 0.0, 0
    cohorts: deque[tuple[int, int]] = deque()  # (requests, steps run before their first): oldest first
    rows = context = 0  # requests in flight and their tokens of K/V, kept as the cohorts change
    while waiting or cohorts:
        admitted = min(waiting, room - rows, (settings.max_num_tokens - rows) // isl)
        if admitted > 0:
            shape = StepShape(rows + admitted * isl, rows + admitted, context,
                              context + rows + admitted * isl * (isl + 1) // 2, rows + admitted)
            seconds += cm.time(shape, hw).total_s
            cohorts.append((admitted, steps))
            context += rows + admitted * (isl + 1)
            rows += admitted
            waiting -= admitted
            steps += 1
        else:  # decode only until the oldest cohort (the one with the fewest tokens left) finishes
            run = osl - (steps - cohorts[0][1])
            middle = context + rows * (run - 1) // 2
            seconds += run * cm.time(StepShape(rows, rows, middle, middle + rows, rows), hw).total_s
            context += rows * run
            steps += run
        while cohorts and steps - cohorts[0][1] >= osl:
            size, _ = cohorts.popleft()
            rows -= size
            context -= size * (isl + osl)
    return seconds
