"""Roofline cost model: the source documents' arithmetic from the config, executed FLOPs against torch's counter."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.errors import ConfigError
from itlbench.sim.roofline import GPUS, CostModel, Gemm, StepShape, load_hardware, measure_cpu

LLAMA3_8B = PRESETS["llama-3-8b"]
H100 = load_hardware("h100-seeds")  # the source documents' arithmetic: 40 % of peak compute, 80 % of bandwidth


def sig3(x: float) -> float:
    """Round to three significant digits, the precision the source documents quote."""
    return float(f"{x:.3g}")


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.for_hardware(LLAMA3_8B, H100)


def test_model_size_and_kv_bytes_come_from_the_config(cm: CostModel) -> None:
    assert sig3(cm.params) == 8.03e9
    assert sig3(cm.weight_bytes) == 16.1e9  # the source documents' 16.06 GB
    assert cm.kv_bytes_per_token == 131_072  # 2 · 32 layers · 8 KV heads · 128 · 2 bytes = 128 KiB


def test_an_fp8_model_may_keep_a_16_bit_cache() -> None:
    """K/V bytes follow the weights' dtype unless told apart: FP8 weights with a 16-bit cache read twice the
    K/V of an FP8 cache, hold half as many tokens, and stream the same weights."""
    fp8 = H100.for_dtype("fp8")
    one, two = CostModel.for_hardware(LLAMA3_8B, fp8), CostModel.for_hardware(LLAMA3_8B, fp8, kv_dtype_bytes=2)
    assert one.kv_bytes_per_token == 65_536 and two.kv_bytes_per_token == 131_072
    step = StepShape.decode(64, 4096)
    assert two.cost(step).kv_read_bytes == 2 * one.cost(step).kv_read_bytes
    assert two.cost(step).weight_bytes == one.cost(step).weight_bytes
    assert two.kv_capacity_tokens(fp8) == pytest.approx(one.kv_capacity_tokens(fp8) / 2, abs=1)


def test_ridge_and_weight_gemm_ridge() -> None:
    assert sig3(H100.ridge) == 295
    d = LLAMA3_8B.hidden_size
    square = Gemm("d x d", d, d)
    t = square.ridge_tokens(H100.ridge, 2)
    assert sig3(t) == 345
    assert square.intensity(round(t), 2) == pytest.approx(H100.ridge, rel=0.01)
    assert square.intensity(1, 2) == pytest.approx(1.0, rel=0.01)  # decode: one FLOP per byte


def test_prefill_2k_and_32k(cm: CostModel) -> None:
    c = cm.cost(StepShape.prefill(2048))
    assert (sig3(c.flops / 1e12), sig3(c.gemm_flops / 1e12), sig3(c.attn_flops / 1e12)) == (34.0, 32.9, 1.10)
    assert sig3(c.intensity) == 2080  # the source documents' 2,082 to three digits
    assert round(c.intensity) == 2082
    c = cm.cost(StepShape.prefill(32768))
    assert sig3(c.flops / 1e12) == 808
    assert c.attn_flops / 1e12 == pytest.approx(282, abs=0.55)  # 281.5: the source documents' 808 − 526 = 282
    assert cm.time(StepShape.prefill(32768), H100).bound == "compute"


def test_decode_batch_32_and_batch_1(cm: CostModel) -> None:
    c = cm.cost(StepShape.decode(32, 2048))
    assert sig3(c.intensity) == 22.2
    achievable = min(H100.peak_flops, H100.mem_bw * c.intensity)
    assert achievable == pytest.approx(74e12, rel=0.01)  # the source documents' 74 TFLOP/s
    assert achievable / H100.peak_flops == pytest.approx(0.075, abs=0.0005)  # 7.5 % of peak
    one = StepShape.decode(1, 2048)
    assert sig3(cm.cost(one).flops / 1e9) == 17.1
    at_peak = H100.with_(gemm_eff=1.0, attn_eff=1.0, mem_eff=1.0)
    assert sig3(cm.time(one, at_peak).total_s * 1e3) == 4.87  # the source documents' 4.9 ms
    assert cm.time(one, at_peak).bound == "memory"


def test_itl_floor_and_crossover(cm: CostModel) -> None:
    assert sig3(cm.weight_bytes / H100.mem_bw * 1e3) == 4.79  # the source documents' 4.8 ms
    crossover = cm.crossover_tokens(H100.ridge)
    assert cm.cost(StepShape.prefill(math.ceil(crossover))).intensity >= H100.ridge
    assert cm.cost(StepShape.prefill(math.floor(crossover))).intensity < H100.ridge
    assert 290 < crossover < 300  # the source documents' ≈ 296 (which ignores attention and KV writes)


def test_the_source_documents_stall_and_decode_step_at_their_efficiencies(cm: CostModel) -> None:
    """40 % of peak compute, 80 % of bandwidth: a 32k prefill of ≈ 2.04 s against 9.2 ms decode steps."""
    stall = cm.time(StepShape.prefill(32768), H100).total_s
    step = cm.time(StepShape.decode(32, 2048), H100).total_s
    assert (sig3(stall), sig3(step * 1e3)) == (2.04, 9.20)
    assert round(stall / step) == 222  # the source documents' "222-fold"


def test_gqa_tied_embeddings_and_executed_counting() -> None:
    m = PRESETS["llama-3.2-1b"]  # tied embeddings, 8 KV heads of 64
    assert m.tie_word_embeddings
    textbook = CostModel(m, 2, "textbook")
    executed = CostModel(m, 2, "executed")
    assert textbook.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert textbook.params == executed.layer_linear_params + executed.norm_params + executed.table_params
    chunk = StepShape.of([(512, 0, False)])  # a prefill chunk that does not reach its last token
    last = StepShape.of([(512, 512, True)])
    assert textbook.cost(chunk).gemm_flops == 2 * textbook.params * 512
    assert executed.cost(chunk).gemm_flops == 2 * executed.layer_linear_params * 512
    lm_head = 2 * m.vocab_size * m.hidden_size
    assert executed.cost(last).gemm_flops - executed.cost(chunk).gemm_flops == lm_head
    assert executed.cost(last).kv_read_bytes == 512 * executed.kv_bytes_per_token
    untied = CostModel(LLAMA3_8B, 2, "executed")  # the untied input table is gathered, never multiplied
    assert untied.params - untied.layer_linear_params - untied.norm_params == 2 * untied.table_params


def test_executed_gemm_flops_match_torchs_flop_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outside count: torch's FlopCounterMode around real engine steps of the tiny preset. The
    counter sees neither the native panel product nor oneDNN's packed one, so the weights keep the
    layout it can count (column-major; the FLOPs of a step do not depend on how its weights are laid out)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.request import SamplingParams
    from itlbench.engine.cpu import weights as cpu_weights
    from itlbench.serving.build import create_engine

    monkeypatch.setattr(cpu_weights, "panel_gemm", lambda: None)
    monkeypatch.setattr(cpu_weights, "_onednn_packs", lambda weight: False)
    torch.set_num_threads(1)
    engine = create_engine(EngineConfig(model="tiny", kv_blocks=64, max_model_len=1024, chunk_budget=120))
    engine.add_request(list(range(3, 103)), SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request(list(range(5, 55)), SamplingParams(max_tokens=3, ignore_eos=True))
    cm = CostModel(PRESETS["tiny"], 4, "executed")
    while engine.has_unfinished():
        with FlopCounterMode(display=False) as counter:
            engine.step()
        rec = engine.step_log.since(engine.step_log.last_step)[0]
        shape = StepShape(rec.scheduled_tokens, rec.num_sampled, rec.context_tokens, rec.attention_pairs)
        counted = sum(v for op, v in counter.get_flop_counts()["Global"].items() if "mm" in str(op))
        assert counted == cm.cost(shape).gemm_flops, rec


def test_hardware_profiles_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    tuned = H100.with_(name="my-h100", gemm_eff=0.61, step_overhead_s=0.002)
    tuned.save(path)
    assert load_hardware(str(path)) == tuned
    assert load_hardware("H100-SXM") == GPUS["h100"] and load_hardware("4090") == GPUS["rtx4090"]
    path.write_text(json.dumps({"name": "x", "peak_flops": 1e12, "mem_bw": 1e11, "memory_bytes": 1e9, "speed": 3}))
    with pytest.raises(ConfigError, match="unknown keys speed") as err:
        load_hardware(str(path))
    assert err.value.field == "--gpu"
    path.write_text(json.dumps({"name": "x", "peak_flops": "fast", "mem_bw": 1e11, "memory_bytes": 1e9}))
    with pytest.raises(ConfigError, match='peak_flops is "fast"') as err:  # not a TypeError in the first step
        load_hardware(str(path), "--base")
    assert err.value.field == "--base" and err.value.fix == "give a number"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hardware(str(path))
    with pytest.raises(ConfigError) as err:
        H100.with_(mem_eff=0.0)
    assert err.value.field == "gpu.mem_eff"


def test_measured_cpu_roofs_are_plausible() -> None:
    cpu = measure_cpu(seconds=0.2)
    assert cpu.counting == "executed" and cpu.dtype == "float32"
    assert 1e9 < cpu.peak_flops < 1e14 and 1e8 < cpu.mem_bw < 1e12


def test_the_cpu_roofs_are_measured_with_numpy_where_torch_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--gpu cpu` without the engine's extra (the harness installs without torch): numpy's matmul and sum."""
    import numpy as np

    from itlbench.sim.cpu_rates import measure_rates

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    called = []
    monkeypatch.setattr(np, "ones", lambda *a, **k: called.append(a) or np.zeros(*a, **k) + 1)
    flops, bw = measure_rates(seconds=0.2)
    assert called and called[0][0] == (512 << 20) // 4, "numpy read the 512 MiB"
    assert 1e9 < flops < 1e14 and 1e8 < bw < 1e12


def test_roofline_command_json_and_tables(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["roofline", "--gpu", "h100-seeds", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kv_bytes_per_token"] == 131_072 and sig3(doc["hardware"]["ridge_flop_per_byte"]) == 295
    prefill = {p["case"]: p for p in doc["phases"]}
    assert sig3(prefill["prefill 32k"]["flops"] / 1e12) == 808
    # the side-by-side follows --gpu's family: the seeds' arithmetic beside a -seeds profile, so its H100 column
    # agrees with the headline (it showed the fitted presets under the same name: crossover 316 under 295)
    assert [g["gpu"] for g in doc["gpus"]] == ["h100-seeds", "h200-seeds", "a100-seeds", "l40s-seeds", "rtx4090-seeds"]
    ridges = {g["gpu"]: g["crossover_prompt_tokens"] for g in doc["gpus"]}
    assert ridges["h100-seeds"] == doc["crossover_prompt_tokens"]
    assert min(ridges, key=ridges.get) == "a100-seeds"  # lowest ridge: short prompts already compute-bound
    fitted = json.loads(runner.invoke(app, ["roofline", "--json"]).stdout)
    assert [g["gpu"] for g in fitted["gpus"]] == ["h100", "h200", "a100", "l40s", "rtx4090"]
    # any Llama-like config.json works, e.g. an untied GQA model with its own head_dim
    cfg = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
           "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    result = runner.invoke(app, ["roofline", "--model", str(tmp_path / "config.json"), "--gpu", "l40s",
                                 "--compare", "none", "--prompt", "1k", "--batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    expected = ModelConfig("x", 32000, 2048, 5632, 22, 32, 4, 2048)
    assert doc["model"]["params"] == expected.num_params
    assert doc["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2 and doc["gpus"] == []
    result = runner.invoke(app, ["roofline", "--gpu", "h100-seeds", "--compare", "h100-seeds,l40s-seeds"],
                           env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    for text in ("crossover prompt length 295 tokens", "131,072 B/token", "L40S", "222×", "34.0 TFLOP", "808 TFLOP"):
        assert text in result.stdout


def test_roofline_marks_the_cases_that_would_not_run() -> None:
    """The default 32k prefill on an 8k-context model, a context past the model's, and a batch whose K/V
    overflows the GPU are still tabulated (the arithmetic holds) but marked, with why."""
    runner = CliRunner()
    result = runner.invoke(app, ["roofline", "--model", "llama-3-8b", "--gpu", "h100", "--compare", "none", "--json"])
    why = {p["case"]: p["does_not_run"] for p in json.loads(result.stdout)["phases"]}
    assert why["prefill 32k"] == "past llama-3-8b's 8k-token context" and why["prefill 2k"] is None
    assert why["decode batch 32 @ 2k"] is None
    result = runner.invoke(app, ["roofline", "--model", "llama-3.1-8b", "--gpu", "h100", "--compare", "none",
                                 "--context", "120k", "--json"])
    why = {p["case"]: p["does_not_run"] for p in json.loads(result.stdout)["phases"]}
    assert why["decode batch 1 @ 120k"] is None
    assert why["decode batch 32 @ 120k"].startswith("3,932,192 tokens of K/V, over the ")
    result = runner.invoke(app, ["roofline", "--model", "llama-3-8b", "--gpu", "h100", "--compare", "none"],
                           env={"COLUMNS": "200"})
    assert "no*" in result.stdout and "* prefill 32k would not run: past llama-3-8b's 8k-token context" \
        in result.stdout


def test_roofline_command_errors_name_the_flag() -> None:
    runner = CliRunner()
    for args, flag in ((["--gpu", "tpu"], "--gpu"), (["--prompt", "abc"], "--prompt"),
                       (["--context", "1k,2k"], "--context"), (["--model", "nope"], "--model")):
        result = runner.invoke(app, ["roofline", *args])
        assert result.exit_code == 2 and flag in result.output, (args, result.output)


def test_a_mixed_step_splits_into_its_prefill_and_decode_parts() -> None:
    """The record of a real mixed step splits into shapes that add back up; the chunk dominates."""
    import torch

    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.request import SamplingParams
    from itlbench.serving.build import create_engine

    torch.set_num_threads(1)
    engine = create_engine(EngineConfig(model="tiny", kv_blocks=128, max_model_len=2048, chunk_budget=256))
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    for i in range(3):
        engine.add_request(list(range(3 + i, 43 + i)), sp)
    engine.step()
    engine.add_request([400 + (7 * i) % 100 for i in range(1000)], sp)
    engine.step()
    rec = engine.step_log.since(engine.step_log.last_step)[0]
    assert rec.phase == "mixed" and rec.decode_tokens == 3 and rec.decode_context_tokens == 3 * 40
    prefill, decode = StepShape.split(rec.to_dict())
    assert prefill + decode == StepShape(rec.scheduled_tokens, rec.num_sampled, rec.context_tokens,
                                         rec.attention_pairs, rec.num_prefill_reqs + rec.num_decode_reqs)
    assert decode == StepShape.decode(3, 40) and prefill == StepShape.of([(253, 0, False)])


def test_a_context_phase_cost_is_charged_on_steps_with_prompt_work_only() -> None:
    """prefill_overhead_s (an engine's context-phase setup) lands on a step with a chunk of more than one
    row, never on a decode-only step; the presets carry none, so their steps cost what they did."""
    cm = CostModel.for_hardware(PRESETS["llama-3-8b"], GPUS["h100"])
    hw = GPUS["h100"].with_(prefill_overhead_s=0.002)
    prompt, decode = StepShape.prefill(512), StepShape.decode(8, 1000)
    mixed = StepShape.of([(256, 0, True)] + [(1, 1000, True)] * 8)
    for shape in (prompt, mixed):
        assert cm.time(shape, hw).total_s - cm.time(shape, GPUS["h100"]).total_s == pytest.approx(0.002)
    assert cm.time(decode, hw).total_s == cm.time(decode, GPUS["h100"]).total_s
    assert all(g.prefill_overhead_s == 0.0 for g in GPUS.values())


def test_a_dtype_a_gpu_lacks_is_refused_naming_only_what_runs_there() -> None:
    """The fix never suggests a format the same GPU also lacks (fp8 on an A100, bfloat16 on the CPU)."""
    from itlbench.errors import ConfigError
    from itlbench.sim.hardware import GPUS

    for gpu, dtype, fix in (("a100", "fp4", "use --dtype bfloat16 or float16 here, or a GPU with FP4 (b200)"),
                            ("rtx4090", "fp8", "use --dtype bfloat16 or float16 here, or a GPU with FP8"),
                            ("h100", "float32", "use --dtype auto, bfloat16, float16 or fp8, or calibrate")):
        with pytest.raises(ConfigError) as err:
            GPUS[gpu].for_dtype(dtype)
        assert fix in str(err.value), str(err.value)


def test_the_gpu_flag_help_names_every_preset() -> None:
    """The help is text in the torch-free config (core cannot import the simulator): it must not drift."""
    from dataclasses import fields

    from itlbench.core.engine_config import EngineConfig
    from itlbench.sim.hardware import GPUS, KERNELS, SEEDS

    text = next(f for f in fields(EngineConfig) if f.name == "gpu").metadata["help"]
    assert all(name in text for name in GPUS) and "NAME-seeds" in text and "NAME-2025" in text
    assert all(name.removesuffix("-seeds") in GPUS for name in SEEDS) and all(k.endswith("-2025") for k in KERNELS)
