"""Disaggregated prefill/decode pools: decode never waits for a prefill; the K/V transfer is charged."""

from __future__ import annotations

import numpy as np
import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.sim.disagg import DisaggEngine, KvLink
from itlbench.sim.roofline import GPUS, CostModel, StepShape
from itlbench.sim.runner import offline_engine
from tests.support.sim import run_offline

MODEL = PRESETS["llama-3.1-8b"]
H100 = GPUS["h100"]


def scenario(streams: int = 32, long_prompt: int = 32768) -> list[tuple[int, list[int], SamplingParams]]:
    """The source documents' scenario: `streams` decoding, then one long prompt (last in the list) arrives."""
    rng = np.random.default_rng(0)
    sp = SamplingParams(max_tokens=300, ignore_eos=True)
    out = [(i * 100_000_000, rng.integers(3, 100_000, 2048).tolist(), sp) for i in range(streams)]
    out.append((4_000_000_000, rng.integers(3, 100_000, long_prompt).tolist(),
                SamplingParams(max_tokens=8, ignore_eos=True)))
    return out


def worst_gap_s(times: dict[str, list[int]], skip: str) -> float:
    return max(float(np.diff(v).max()) for k, v in times.items() if k != skip and len(v) > 1) / 1e9


def test_disaggregation_removes_the_prefill_stall() -> None:
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None)
    work = scenario()
    colocated = run_offline(offline_engine(cfg), work)
    disagg = run_offline(DisaggEngine(cfg, paced=False), work)
    prefill_32k = CostModel.for_hardware(MODEL, H100).time(StepShape.prefill(32768), H100).total_s
    assert worst_gap_s(colocated, "r32") > 0.9 * prefill_32k  # every stream waits for the 32k prefill
    assert worst_gap_s(disagg, "r32") < 0.05  # decode pool: batch-32 steps only
    for times in (colocated, disagg):  # every request got exactly what it asked for
        assert sorted(len(v) for v in times.values()) == [8] + [300] * 32
    ttft = (disagg["r32"][0] - work[-1][0]) / 1e9
    assert ttft >= prefill_32k


def test_kv_transfer_is_charged_between_first_and_second_token() -> None:
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None)
    slow = KvLink(bandwidth_bytes_per_s=1e9, latency_s=0.0)  # 8 Gb/s: the transfer dominates
    prompt = list(range(3, 3 + 8192))
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    times = run_offline(DisaggEngine(cfg, paced=False, link=slow), [(0, prompt, sp)])["r0"]
    transfer = (8192 + 1) * MODEL.kv_bytes_per_token(2) / 1e9
    assert len(times) == 4
    assert (times[1] - times[0]) / 1e9 == pytest.approx(transfer, rel=0.05)  # plus one decode step


def test_disaggregated_outputs_count_the_clients_tokens_and_gpus_differ() -> None:
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h200", chunk_budget=2048)
    engine = DisaggEngine(cfg, paced=False, prefill_gpu="a100")
    assert engine.device == "sim:a100->h200"
    engine.add_request(list(range(3, 3 + 5000)), SamplingParams(max_tokens=5, ignore_eos=True), "x", 0)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [len(o.new_token_ids) for o in outs] == [1] * 5
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].num_prompt_tokens == 5000 and outs[-1].num_output_tokens == 5
    prefill_steps = [r for r in engine.step_log.since(0) if r.prefill_tokens >= 500]
    assert len(prefill_steps) == 3  # chunked on the prefill pool: 2048 + 2048 + 904
    a100 = CostModel.for_hardware(MODEL, GPUS["a100"])
    first_chunk = StepShape.of([(2048, 0, False)])  # the first of three chunks: no token sampled yet
    assert prefill_steps[0].duration_s == pytest.approx(a100.time(first_chunk, GPUS["a100"]).total_s,
                                                         abs=1e-9)


def test_abort_in_either_pool() -> None:
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None)
    engine = DisaggEngine(cfg, paced=False)
    engine.add_request(list(range(3, 3 + 100)), SamplingParams(max_tokens=50, ignore_eos=True), "a", 0)
    engine.add_request(list(range(7, 7 + 100)), SamplingParams(max_tokens=50, ignore_eos=True), "b", 0)
    engine.step()
    engine.step()
    assert engine.abort("a") and not engine.abort("nope")
    seen = set()
    while engine.has_unfinished():
        seen |= {o.request_id for o in engine.step() if o.finished}
    assert seen == {"b"}
    assert engine.decode.block_manager.num_free_blocks == engine.decode.block_manager.num_blocks
