"""What a serving runtime keeps on each GPU beside the weights and the K/V cache, so the K/V room it really has.

Runtimes size their K/V cache from what is left after loading the weights and running one profiling step at their
largest step (vLLM's `determine_available_memory`, TensorRT-LLM's `tensorrt_llm/_torch/pyexecutor/_util.py`): the
CUDA context, cuBLAS and all-reduce workspaces and NCCL buffers, plus that step's activations. Where the weights fill
most of a GPU (a 70B in FP8 on one H100) that reserve decides the batch: left out, TensorRT-LLM's published runs of
that deployment came out a third fast (docs/perf/sim-vs-published.md). Those runs are predicted with it
(sim/trtllm_bench.py). The simulated engine keeps none (vLLM's own logs put its non-torch part anywhere from 0.1 to
3.6 GiB), so a run whose room it would take most of is warned (sim/accuracy.py). Torch-free.
"""

from __future__ import annotations

GIB = 1024 ** 3
# The fixed part, GiB a GPU by TP degree: the one value per degree that reproduces all twelve largest concurrent
# batches TensorRT-LLM held for Llama-3.1-8B on H100 SXM (TP1/2/4, isl and osl 2,048/4,096, free fraction 0.8;
# measured by NVIDIA: ai-dynamo/aiconfigurator tests/integration/test_trtllm_kv_cache_capacity.py). Each batch bounds
# it to an interval: TP1 2.75-3.10, TP2 4.00-4.15, TP4 4.77-4.85. vLLM's start-up log for Llama-3-8B on an H100
# agrees within half a GiB (non-torch 1.79 + activation peak 1.26 GiB at TP1, 3.58 + 1.26 at TP2; vllm-project/vllm
# #10511). TP8 was not measured: TP4's.
RESERVE_GIB = {1: 2.9, 2: 4.1, 4: 4.8}
# The profiling step's activation peak, bytes a token per hidden unit by TP degree (NVIDIA's aiconfigurator, Llama
# family, sdk/backends/trtllm_backend.py: 2 x 11, 6.5, 5)
ACTIVATION_BYTES = {1: 22.0, 2: 13.0, 4: 10.0}


def _degree(tp: int) -> int:
    return max(d for d in RESERVE_GIB if d <= tp)


def fixed_reserve_gib(tp: int) -> float:
    """The fixed part a GPU of a `tp`-way deployment keeps, GiB."""
    return RESERVE_GIB[_degree(tp)]


def reserve_bytes(tp: int, hidden_size: int, step_tokens: int) -> float:
    """Bytes one GPU of a `tp`-way deployment keeps beside weights and K/V when its largest step is `step_tokens`."""
    return fixed_reserve_gib(tp) * GIB + ACTIVATION_BYTES[_degree(tp)] * step_tokens * hidden_size
