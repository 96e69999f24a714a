"""The simulated engine: same scheduling decisions as the real one, virtual-clock durations, no torch."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError
from itlbench.serving.build import create_engine
from itlbench.sim.roofline import GPUS, CostModel, StepShape
from itlbench.sim.runner import PacedClock, VirtualClock, offline_engine

DECISION_FIELDS = ("phase", "prefill_tokens", "decode_tokens", "num_prefill_reqs", "num_decode_reqs",
                   "num_running", "num_waiting", "num_preemptions", "num_finished", "num_sampled",
                   "context_tokens", "attention_pairs", "prefill_request_ids")


def seeded_workload(seed: int, n: int = 12) -> list[tuple[int, list[int], SamplingParams]]:
    """(step at which it arrives, prompt, sampling): mixed lengths, one long prompt, forced lengths."""
    rng = np.random.default_rng(seed)
    vocab = PRESETS["tiny"].vocab_size
    out = []
    for i in range(n):
        length = 700 if i == n // 2 else int(rng.integers(5, 120))
        out.append((int(rng.integers(0, 20)), rng.integers(3, vocab, length).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(2, 24)), temperature=0.0, ignore_eos=True)))
    return sorted(out, key=lambda w: w[0])


def drive(engine: Engine, workload: list[tuple[int, list[int], SamplingParams]]) -> list[tuple]:
    pending = list(workload)
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, sp = pending.pop(0)
            engine.add_request(prompt, sp, request_id=f"r{len(workload) - len(pending)}")
        engine.step()
        step += 1
    return [tuple(getattr(r, f) for f in DECISION_FIELDS) for r in engine.step_log.since(0)]


@pytest.mark.parametrize("knobs", [
    dict(chunk_budget=64),
    dict(chunk_budget=None, unchunked_prefill_cap=256),
    dict(chunk_budget=128, policy="prefill-first"),
    dict(chunk_budget=128, policy="prefill-first", mixed=True),
    dict(chunk_budget=96, kv_blocks=60),  # too few blocks: preemption and recompute
], ids=["budget", "unchunked", "prefill-first", "prefill-first-mixed", "preempting"])
def test_sim_and_real_engine_make_the_same_decisions(knobs: dict) -> None:
    import torch

    torch.set_num_threads(1)
    base = dict(model="tiny", kv_blocks=128, block_size=16, max_num_seqs=8, seed=3) | knobs
    workload = seeded_workload(7)
    real = drive(create_engine(EngineConfig(**base)), workload)  # type: ignore[arg-type]
    sim = drive(offline_engine(EngineConfig(**base, engine="sim", gpu="h100")), workload)  # type: ignore[arg-type]
    assert len(real) > 20
    assert sim == real
    if "kv_blocks" in knobs:
        assert sum(r[DECISION_FIELDS.index("num_preemptions")] for r in real) > 0


def test_step_records_carry_the_cost_models_durations() -> None:
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=2048)
    engine = offline_engine(cfg, start_ns=10**12)
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    for i in range(8):
        engine.add_request([3 + i] * 1000, sp)
    while engine.has_unfinished():
        engine.step()
    recs = engine.step_log.since(0)
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], GPUS["h100"])
    assert recs[0].start_ns == 10**12
    for prev, rec in zip(recs, recs[1:], strict=False):
        assert rec.start_ns == prev.end_ns  # back to back: the virtual clock only moves by steps
    for rec in recs:
        shape = StepShape(rec.scheduled_tokens, rec.num_sampled, rec.context_tokens, rec.attention_pairs,
                          rec.num_prefill_reqs + rec.num_decode_reqs)
        assert rec.duration_s == pytest.approx(cm.time(shape, GPUS["h100"]).total_s, abs=1e-9)
    decode = [r for r in recs if r.phase == "decode" and r.num_decode_reqs == 8]
    assert decode and all(0.004 < r.duration_s < 0.01 for r in decode)  # ~ weights / (0.8 × 3.35 TB/s)


def test_paced_clock_ends_steps_at_cost_over_time_scale() -> None:
    clock = PacedClock(time_scale=4.0)
    start = clock.now_ns()
    clock.charge(0.2)
    end = clock.end_step(start)
    assert end - start == 50_000_000  # 0.2 s simulated at 4x
    assert clock.now_ns() >= end  # it waited for the step to be over


def test_virtual_clock_never_goes_back() -> None:
    clock = VirtualClock(100)
    clock.advance_to(50)
    assert clock.now_ns() == 100
    clock.charge(1e-6)
    assert clock.end_step(clock.now_ns()) == 1100


def test_sim_engine_needs_no_torch_and_allocates_no_weights() -> None:
    code = ("import sys, time\n"
            "from itlbench.core.engine_config import EngineConfig\n"
            "from itlbench.sim.runner import offline_engine\n"
            "from itlbench.core.request import SamplingParams\n"
            "e = offline_engine(EngineConfig(model='llama-3.1-8b', engine='sim', gpu='h100-seeds', chunk_budget=None))\n"
            "e.add_request(list(range(3, 32771)), SamplingParams(max_tokens=2, ignore_eos=True))\n"
            "while e.has_unfinished(): e.step()\n"
            "r = e.step_log.since(0)[0]\n"
            "print(round(r.duration_s, 2), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2.04", "False"]  # the source documents' 32k prefill on an H100, computed without torch


def test_sim_sizes_the_kv_cache_from_device_memory() -> None:
    engine = offline_engine(EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=32768))
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], GPUS["h100"])
    assert GPUS["h100"].memory_bytes == 81_559 * 2**20  # what an H100 80GB reports, not 80e9
    expected_tokens = (0.9 * GPUS["h100"].memory_bytes - cm.weight_bytes) / cm.kv_bytes_per_token
    assert engine.block_manager.num_blocks == int(expected_tokens) // 16
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="llama-3.1-8b", engine="sim", gpu="rtx4090"))  # 128k context on 24 GB
    assert err.value.field == "max_model_len"
    big = ModelConfig(name="wide", vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_layers=80,
                      num_heads=64, num_kv_heads=8, max_position_embeddings=4096)
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="tiny", engine="sim", gpu="h100"), model_config=big)
    assert err.value.field == "gpu" and "do not fit" in str(err.value)


def test_sim_options_are_validated() -> None:
    with pytest.raises(ConfigError) as err:
        EngineConfig(gpu="h100")
    assert err.value.field == "gpu"
    with pytest.raises(ConfigError) as err:
        EngineConfig(engine="sim", sim_time_scale=0)
    assert err.value.field == "sim_time_scale"
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="tiny", engine="sim", gpu="tpu-v5"))  # not a preset
    assert err.value.field == "--gpu"


def test_paced_sim_engine_streams_in_simulated_time() -> None:
    """Served mode: a step's end is its start plus its cost, and the wall clock agrees."""
    cfg = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None, sim_time_scale=10.0)
    engine = create_engine(cfg)
    engine.add_request(list(range(3, 8195)), SamplingParams(max_tokens=3, ignore_eos=True))
    t0 = time.perf_counter_ns()
    while engine.has_unfinished():
        engine.step()
    recs = engine.step_log.since(0)
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], GPUS["h100"])
    prefill = cm.time(StepShape.prefill(8192), GPUS["h100"]).total_s
    assert recs[0].duration_s == pytest.approx(prefill / 10.0, abs=1e-9)
    assert time.perf_counter_ns() - t0 >= sum(r.end_ns - r.start_ns for r in recs)


def test_sim_flags_are_checked_before_anything_starts(tmp_path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from itlbench.cli import app

    cases = [
        (["run", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "rtx4090"], "--max-model-len", "42262"),
        (["run", "--engine", "sim", "--gpu", "h100", "--dtype", "float32"], "--dtype", "bfloat16"),
        (["run", "--gpu", "h100"], "--gpu", "--engine sim"),
        (["run", "--engine", "sim", "--gpu", "tpu-v9"], "--gpu", "unknown GPU"),
        (["run", "--engine", "gpu"], "--engine", "torch, sim"),
        (["run", "--engine", "sim", "--sim-time-scale", "0"], "--sim-time-scale", "> 0"),
        (["run", "--engine", "sim", "--prefill-gpu", "a100"], "--prefill-gpu", "--disaggregate"),
        (["serve", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "rtx4090"], "--max-model-len", "42262"),
    ]
    runner = CliRunner()
    for args, flag, text in cases:
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "never")] if args[0] == "run" else args)
        assert result.exit_code == 2, (args, result.output)
        assert flag in result.output and text in result.output.replace("\n", " "), (args, result.output)
    assert not (tmp_path / "never").exists()
