"""trtllm-bench's settings and the in-flight schedule that predicts TensorRT-LLM's offline throughputs."""

from __future__ import annotations

import pytest

from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.sim.hardware import presets
from itlbench.sim.memory import RESERVE_GIB
from itlbench.sim.roofline import CostModel
from itlbench.sim.shapes import StepShape
from itlbench.sim.trtllm_bench import (
    BenchSettings,
    _round_batch,
    _round_tokens,
    bench_settings,
    offline_seconds,
    runtime_kv_tokens,
    schedulable,
)

H100 = presets()["h100"].for_dtype("fp8")
CM = CostModel.for_hardware(PRESETS["llama-3.1-8b"], H100)


def _one_request_at_a_time(cm: CostModel, isl: int, osl: int, requests: int, s: BenchSettings) -> float:
    """The same schedule request by request and step by step, no cohorts and no stretches."""
    room = min(s.max_batch_size, s.kv_tokens // (-(-(isl + osl) // 32) * 32))
    waiting, running, seconds = requests, [], 0.0  # running: tokens generated per request
    while waiting or running:
        admitted = min(waiting, room - len(running), max(0, (s.max_num_tokens - len(running)) // isl))
        chunks = [(1, isl + done, True) for done in running] + [(isl, 0, True)] * admitted
        seconds += cm.time(StepShape.of(chunks), H100).total_s
        running = [d + 1 for d in running if d + 1 < osl] + [1] * admitted
        waiting -= admitted
    return seconds


@pytest.mark.parametrize("settings", [
    BenchSettings(48, 2048, 10**6),  # the batch limit binds
    BenchSettings(512, 2048, 20 * 160),  # the K/V room binds (20 requests of 160 tokens)
    BenchSettings(60, 300, 10**6),  # the token budget binds: two prompts a step at most
])
def test_cohorts_and_stretches_give_the_step_by_step_time(settings: BenchSettings) -> None:
    step_by_step = _one_request_at_a_time(CM, 100, 60, 150, settings)
    assert offline_seconds(CM, H100, 100, 60, 150, settings) == pytest.approx(step_by_step, rel=2e-3)


def test_requests_of_one_shape_run_in_waves() -> None:
    """Admitted together, fixed-shape requests finish together: one request past a full batch costs a
    whole wave of decode steps, most of a full batch's time (those steps read all the weights), where a
    share of the work (65/64) would cost 2 % more."""
    s = BenchSettings(64, 8192, 10**7)
    full = offline_seconds(CM, H100, 128, 256, 64, s)
    assert offline_seconds(CM, H100, 128, 256, 65, s) > 1.5 * full
    assert offline_seconds(CM, H100, 128, 256, 128, s) < 2.1 * full


def test_the_settings_follow_trtllm_bench_rounding() -> None:
    assert [_round_batch(x) for x in (10, 250, 256, 1000, 1025, 4096)] == [64, 256, 256, 1024, 1280, 4096]
    assert [_round_tokens(x) for x in (100, 2100, 4096, 8000, 8193)] == [2048, 2304, 4096, 8192, 9216]
    # Llama-3.1-8B FP8 on one H100 (81,559 MiB): the estimate leaves 71.6 GiB beside 8.0 GiB of weights, 95 % of
    # it for K/V at 64 KiB a token: 1.11 M tokens, 4,352 requests of 256 (capped at 4,096), 8,192 tokens a step.
    # The runtime then has 79.6 - 8.5 (16-bit tables) - 0.69 (activations of 8,192 tokens) - 2.9 GiB: 1.05 M tokens
    s = bench_settings(CM, H100, 128, 128)
    assert (s.max_batch_size, s.max_num_tokens) == (4096, 8192)
    assert s.kv_tokens == pytest.approx(1.052e6, rel=0.01)
    long_out = bench_settings(CM, H100, 1000, 2000)  # 371 requests of 3,000 tokens: 384, and the 2,048 floor
    assert (long_out.max_batch_size, long_out.max_num_tokens) == (384, 2048)


def test_an_nvfp4_engine_is_sized_at_half_a_byte_a_parameter() -> None:
    """tuning.py's estimate counts every NVFP4 parameter at 0.5 bytes (no scales, no 16-bit tables): Llama-3.3-70B
    on one B200 (183,359 MiB) leaves 179.1 - 32.9 GiB, 95 % of it for K/V at 160 KiB a token in FP8, room for 215
    requests of 4,224 tokens: a batch of 224. The runtime allocates from what is really left: 39.8 GiB of weights
    (4.5-bit layers, 16-bit tables), the activations of 2,048 tokens and the 2.9 GiB reserve."""
    b200 = presets()["b200"].for_dtype("fp4")
    cm = CostModel.for_hardware(PRESETS["llama-3.3-70b"], b200)
    s = bench_settings(cm, b200, 128, 4096)
    engine_gib = cm.params * 0.5 / 2**30
    estimate = (183_359 / 1024 - engine_gib) * 0.95 * 2**30 / 163_840
    assert 215 < estimate / 4224 < 216 and (s.max_batch_size, s.max_num_tokens) == (224, 2048)
    left = 183_359 * 2**20 - cm.weight_bytes_per_gpu - 22 * 2048 * 8192 - 2.9 * 2**30
    assert s.kv_tokens == int(left * 0.95 / 163_840) and cm.weight_bytes_per_gpu / 2**30 > engine_gib + 5


# The largest concurrent batches TensorRT-LLM held for Llama-3.1-8B in BF16 (weights and K/V) on H100 SXM with
# --max_seq_len isl + osl + 1000, --max_num_tokens 2 x isl and a free-memory fraction of 0.8, measured by NVIDIA:
# ai-dynamo/aiconfigurator tests/integration/test_trtllm_kv_cache_capacity.py. (tp, isl, osl, batch)
MEASURED_BATCHES = [(1, 2048, 2048, 78), (2, 2048, 2048, 173), (4, 2048, 2048, 363), (1, 2048, 4096, 56),
                    (2, 2048, 4096, 124), (4, 2048, 4096, 259), (1, 4096, 2048, 55), (2, 4096, 2048, 123),
                    (4, 4096, 2048, 258), (1, 4096, 4096, 43), (2, 4096, 4096, 96), (4, 4096, 4096, 201)]


@pytest.mark.parametrize(("tp", "isl", "osl", "batch"), MEASURED_BATCHES)
def test_the_runtime_kv_room_holds_the_batches_tensorrt_llm_measured(tp: int, isl: int, osl: int, batch: int) -> None:
    """Every measured batch, exactly: the weights, the profiling step's activations and one reserve per degree. The
    whole GPU less the weights alone would hold 5-7 % more, off by 3-15 requests."""
    bf16 = presets()["h100"]
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], bf16, tp=tp)
    request = -(-(isl + osl + 1000) // 32) * 32
    assert runtime_kv_tokens(cm, bf16, 2 * isl, 0.8) // request == batch
    without = int((bf16.memory_bytes - cm.weight_bytes_per_gpu) * 0.8 * tp / (cm.kv_bytes_per_token)) // request
    assert 1.04 * batch < without < 1.08 * batch
    assert RESERVE_GIB[1] < RESERVE_GIB[2] < RESERVE_GIB[4]  # all-reduce workspaces grow


# The same measurement of Qwen3-32B-FP8 (FP8 layers, 16-bit embedding and LM head, K/V in BF16) on H100 SXM: held
# out of the reserve, which was read off Llama-3.1-8B alone. (tp, isl, osl, batch)
QWEN3_32B_FP8_BATCHES = [(1, 2048, 2048, 27), (2, 2048, 2048, 75), (4, 2048, 2048, 169), (1, 2048, 4096, 19),
                         (2, 2048, 4096, 53), (4, 2048, 4096, 121), (1, 4096, 2048, 19), (2, 4096, 2048, 53),
                         (4, 4096, 2048, 120), (1, 4096, 4096, 14), (2, 4096, 4096, 41), (4, 4096, 4096, 93)]
QWEN3_32B = ModelConfig("qwen3-32b", vocab_size=151_936, hidden_size=5120, intermediate_size=25_600, num_layers=64,
                        num_heads=64, num_kv_heads=8, max_position_embeddings=40_960, head_dim=128)


def test_the_reserve_read_off_one_model_holds_another_models_measured_batches_within_one_request() -> None:
    """Another model, another number format, 4x the weights: the runtime room with Llama-3.1-8B's reserve gives four
    of the twelve batches exactly and the other eight one request more (+2.2 % on average, the most +7.1 % on the
    batch of 14). Qwen's batches want a larger reserve (TP1 4.64-5.06 GiB where Llama's are 2.75-3.10, TP4 5.18-5.28
    against 4.77-4.85): the fixed part is not one number for every model, which is why the simulated engine warns
    rather than keeps one."""
    fp8 = presets()["h100"].for_dtype("fp8")
    off = []
    for tp, isl, osl, batch in QWEN3_32B_FP8_BATCHES:
        cm = CostModel.for_hardware(QWEN3_32B, fp8, tp=tp, kv_dtype_bytes=2)
        request = -(-(isl + osl + 1000) // 32) * 32
        off.append((runtime_kv_tokens(cm, fp8, 2 * isl, 0.8) // request - batch, batch))
    assert sorted(d for d, _ in off) == [0] * 4 + [1] * 8
    assert 0.021 < sum(d / b for d, b in off) / len(off) < 0.022 and max(d / b for d, b in off) == 1 / 14
    assert 31.9 < CostModel.for_hardware(QWEN3_32B, fp8, kv_dtype_bytes=2).weight_bytes_per_gpu / 2**30 < 32.0


def test_a_prompt_that_cannot_fit_beside_the_batch_is_not_predicted() -> None:
    """2,048-token prompts under a 2,048-token budget: the published run must have chunked its context."""
    s = bench_settings(CM, H100, 2048, 2048)
    assert s.max_num_tokens == 2048 and not schedulable(s, 2048, 2048)
    assert schedulable(bench_settings(CM, H100, 2048, 128), 2048, 128)
    with pytest.raises(ValueError, match="does not fit"):
        offline_seconds(CM, H100, 2048, 2048, 10, s)
