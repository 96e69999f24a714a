"""Tensor parallelism, FP8 and the presets: shards, all-reduces, per-GPU K/V room, unchanged decisions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS, load_model_config
from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError
from itlbench.sim.hardware import FIT, Hardware
from itlbench.sim.operators import gemm_parts, gemm_seconds
from itlbench.sim.roofline import GPUS, SEEDS, CostModel, StepShape, load_hardware
from itlbench.sim.runner import offline_engine

L70 = PRESETS["llama-2-70b"]
H100 = GPUS["h100"]


def test_tp_splits_weights_flops_and_kv_and_adds_two_allreduces_per_layer() -> None:
    one, two = CostModel.for_hardware(L70, H100), CostModel.for_hardware(L70, H100, tp=2)
    shape = StepShape.prefill(2048)
    c1, c2 = one.cost(shape), two.cost(shape)
    assert c2.gemm_flops == pytest.approx(c1.gemm_flops / 2) and c2.attn_flops == pytest.approx(c1.attn_flops / 2)
    assert two.kv_bytes_per_token_per_gpu == one.kv_bytes_per_token // 2  # 8 K/V heads: 4 per GPU
    norms = one.norm_params * one.b
    assert two.weight_bytes_per_gpu == pytest.approx((one.weight_bytes - norms) / 2 + norms)
    # a ring all-reduce of 2,048 rows of 8,192 bf16 activations over one NVLink direction, plus its fixed cost
    message = 2048 * 8192 * 2
    expected = 2 * (2 - 1) / 2 * message / (H100.link_bw * H100.link_eff) + H100.link_latency_s
    assert two.allreduce_s(2048, H100) == pytest.approx(expected) and one.allreduce_s(2048, H100) == 0.0
    t2 = two.time(shape, H100)
    assert t2.comm_s == pytest.approx(2 * L70.num_layers * expected)
    assert t2.total_s < one.time(shape, H100).total_s  # half the work per GPU, even paying for the all-reduces
    # the roofline (seeds) profile pays its all-reduces too, at the full link rate (no fitted link efficiency)
    seeds = load_hardware("h100-seeds")
    at_link = 2 * L70.num_layers * (message / seeds.link_bw + seeds.link_latency_s)
    assert CostModel.for_hardware(L70, seeds, tp=2).time(shape, seeds).comm_s == pytest.approx(at_link)


def test_tp_with_fewer_kv_heads_than_gpus_replicates_them_and_bad_degrees_are_refused() -> None:
    cm = CostModel(L70, 2, tp=16)  # 8 K/V heads on 16 GPUs: one head each, replicated
    assert cm.kv_heads_per_gpu == 1 and cm.kv_bytes_per_token_per_gpu == cm.kv_bytes_per_token // 8
    for tp, field in ((3, "tp"), (0, "tp")):
        with pytest.raises(ConfigError) as err:
            CostModel(L70, 2, tp=tp)
        assert err.value.field == field
    with pytest.raises(ConfigError) as err:  # no link in the profile: TP cannot be priced
        CostModel(L70, 2, tp=2).time(StepShape.prefill(16), H100.with_(link_bw=0.0))
    assert err.value.field == "tp"
    for bad in (dict(tp=2), dict(dtype="fp8")):  # simulated only
        with pytest.raises(ConfigError) as err:
            EngineConfig(**bad)
        assert err.value.field in bad


def test_kv_room_is_per_gpu_memory_and_70b_fits_only_sharded_or_in_fp8() -> None:
    with pytest.raises(ConfigError) as err:  # 138 GB of bf16 weights on one 80 GB H100
        offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h100"))
    assert err.value.field == "gpu" and "do not fit" in str(err.value)
    cfg = EngineConfig(model="llama-2-70b", engine="sim", gpu="h100", tp=2, dtype="fp8")
    engine = offline_engine(cfg)
    cm = CostModel.for_hardware(L70, H100.for_dtype("fp8"), tp=2)
    room = (0.9 * 80e9 - cm.weight_bytes_per_gpu) / cm.kv_bytes_per_token_per_gpu
    assert cm.kv_bytes_per_token_per_gpu == 80 * 4 * 128 * 2  # K and V, 80 layers, 4 heads of 128, one byte
    assert engine.block_manager.num_blocks == min(int(room) // 16, 64 * 4096 // 16)
    assert engine.runner.info.device == "sim:h100x2" and engine.runner.info.dtype == "fp8"


def test_kv_memory_gib_is_the_room_a_runtime_reported_even_past_vllms_90_percent() -> None:
    """Llama-2-70B in 16 bits on one H200: 128.5 GiB of weights do not fit in 90 % of 140.4 GiB, but a runtime run at
    a higher utilisation reports room, and --kv-memory-gib takes it; on an H100 the weights do not fit at all."""
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h200", max_model_len=4096))
    assert err.value.field == "gpu" and "--kv-memory-gib" in str(err.value)
    engine = offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h200", max_model_len=4096,
                                         kv_memory_gib=8))
    per_token = engine.runner.cost_model.kv_bytes_per_token_per_gpu
    assert engine.block_manager.num_blocks == min(int(8 * 2**30 // per_token) // 16, 64 * 4096 // 16)
    assert engine.runner.kv_share is None  # the user's room: no tight-room check
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h100", kv_memory_gib=1))
    assert err.value.field == "gpu" and "do not fit" in str(err.value)
    with pytest.raises(ConfigError) as err:  # past the whole GPU no runtime has room: --kv-memory-gib is no way out
        offline_engine(EngineConfig(model="llama-3.1-405b", engine="sim", gpu="h100", tp=2))
    said = str(err.value)
    assert "llama-3.1-405b's weights (756.0 GiB, 378.0 GiB per GPU at --tp 2) do not fit in 90% of the H100 SXM's" \
        in said and "--kv-memory-gib" not in said and "a higher --tp" in said


def test_a_degree_past_the_gpus_one_link_joins_is_refused_unless_the_profile_joins_more(tmp_path: Path) -> None:
    """--tp 16 on H100s would all-reduce across two HGX baseboards, over InfiniBand, which no profile prices: the
    simulated engine once ran it at NVLink's cost. It is refused in one line; a profile whose link joins more GPUs
    (link_domain, a GB200 NVL72's 72) takes it."""
    with pytest.raises(ConfigError) as err:
        offline_engine(EngineConfig(model="llama-3.3-70b", engine="sim", gpu="h100", tp=16))
    assert err.value.field == "tp" and "16 GPUs exceed the H100 SXM's NVLink 4 domain of 8" in str(err.value)
    assert GPUS["h100"].link_domain == 8 and "8 GPUs" in GPUS["h100"].sources["link_domain"]
    offline_engine(EngineConfig(model="llama-3.3-70b", engine="sim", gpu="h100", tp=8))
    wide = tmp_path / "nvl.json"
    GPUS["b200"].with_(name="nvl", link_domain=72).save(wide)
    engine = offline_engine(EngineConfig(model="llama-3.1-405b", engine="sim", gpu=str(wide), tp=16, dtype="fp4"))
    assert engine.runner.cost_model.tp == 16
    result = CliRunner().invoke(app, ["roofline", "--model", "llama-3.3-70b", "--tp", "16", "--compare", "none"])
    assert result.exit_code == 2 and "error: --tp: 16 GPUs exceed" in result.output
    with pytest.raises(ConfigError, match="gpu.link_domain"):
        GPUS["h100"].with_(link_domain=0)


def test_fp8_weights_beside_a_16_bit_cache() -> None:
    """--kv-cache-dtype bfloat16 under --dtype fp8 (vLLM's default for an FP8 checkpoint without K/V scales):
    the same one-byte weights, twice the K/V bytes a token, half the K/V room, slower long-context decode."""
    fp8 = offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h100", tp=2, dtype="fp8"))
    mixed = offline_engine(EngineConfig(model="llama-2-70b", engine="sim", gpu="h100", tp=2, dtype="fp8",
                                        kv_cache_dtype="bfloat16"))
    one, two = fp8.runner.cost_model, mixed.runner.cost_model
    assert two.kv_bytes_per_token_per_gpu == 2 * one.kv_bytes_per_token_per_gpu
    assert two.weight_bytes_per_gpu == one.weight_bytes_per_gpu
    hw = fp8.runner.hardware
    assert two.kv_capacity_tokens(hw) == pytest.approx(one.kv_capacity_tokens(hw) / 2, abs=1)
    step = StepShape.decode(64, 8192)
    assert two.time(step, hw).total_s > 1.2 * one.time(step, hw).total_s
    assert "K/V at 2 B an element" in mixed.runner.describe() and "K/V at 1 B" in fp8.runner.describe()
    for bad, fix in ((dict(kv_cache_dtype="fp8"), "--engine sim"), (dict(engine="sim", kv_cache_dtype="fp4"), "use one")):
        with pytest.raises(ConfigError) as err:
            EngineConfig(**bad)
        assert err.value.field == "kv_cache_dtype" and fix in str(err.value)


def test_fp8_uses_the_fp8_rate_and_one_byte_layer_weights_only_where_the_gpu_has_it() -> None:
    fp8 = H100.for_dtype("fp8")
    assert fp8.gemm_peak == 1979e12 and fp8.peak_flops == 989e12  # attention stays at the half rate
    assert fp8.gemm_efficiency == FIT["fp8_gemm_eff_h100"] and H100.for_dtype("float16").dtype == "float16"
    m = PRESETS["llama-3-8b"]
    bf16, f8 = CostModel.for_hardware(m, H100), CostModel.for_hardware(m, fp8)
    # the layers' linear weights at one byte, the embedding and LM head in 16 bits (vLLM's Fp8Config leaves its
    # ParallelLMHead unquantized, vllm-project/vllm#41000): Llama-3-8B's 9.08 GB against 16.06 GB, the sizes
    # tinygrad/tinygrad#12893 loaded with and without --quantize fp8
    assert bf16.weight_bytes == pytest.approx(16.06e9, rel=1e-3) and f8.weight_bytes == pytest.approx(9.08e9, rel=1e-3)
    assert (f8.b, f8.table_b) == (1, 2) and f8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    decode = StepShape.decode(32, 2048)
    assert f8.time(decode, fp8).total_s < bf16.time(decode, H100).total_s
    with pytest.raises(ConfigError) as err:
        GPUS["a100"].for_dtype("fp8")
    assert err.value.field == "dtype" and "no FP8" in str(err.value)


def test_fp4_is_nvfp4_on_a_b200_with_16_bit_tables_and_an_fp8_cache() -> None:
    """--dtype fp4: 4-bit weights with an FP8 scale per 16 (4.5 bits), the embedding and LM head in 16 bits, an FP8
    K/V cache, the dense FP4 rate. nvidia/Llama-3.3-70B-Instruct-NVFP4's index holds 42,709,045,632 bytes."""
    b200 = GPUS["b200"]
    fp4 = b200.for_dtype("fp4")
    assert (fp4.gemm_peak, fp4.peak_flops, fp4.gemm_efficiency) == (9000e12, 2250e12, FIT["fp4_gemm_eff_blackwell"])
    cm = CostModel.for_hardware(PRESETS["llama-3.3-70b"], fp4)
    assert cm.weight_bytes == pytest.approx(42_709_045_632, rel=1e-3)
    assert (cm.kv_b, cm.table_b) == (1, 2)
    assert CostModel.for_hardware(PRESETS["llama-3.3-70b"], fp4, kv_dtype_bytes=2).kv_b == 2  # --kv-cache-dtype wins
    # the LM head reads 16-bit weights at the 16-bit rate, the layers 4.5-bit ones at the FP4 rate
    head, layer = gemm_parts(cm, 1, 8192, 128_256, fp4, table=True), gemm_parts(cm, 1, 8192, 128_256, fp4)
    assert head[1] == pytest.approx(layer[1] * 2 / 0.5625, rel=1e-3) and head[0] > layer[0]
    decode = StepShape.decode(64, 2048)
    assert cm.time(decode, fp4).total_s < CostModel.for_hardware(PRESETS["llama-3.3-70b"], b200.for_dtype("fp8")).time(
        decode, b200.for_dtype("fp8")).total_s
    for gpu in ("h100", "a100"):
        with pytest.raises(ConfigError) as err:
            GPUS[gpu].for_dtype("fp4")
        assert err.value.field == "dtype" and "no FP4" in str(err.value) and "b200" in str(err.value)
    with pytest.raises(ConfigError) as err:
        EngineConfig(dtype="fp4")
    assert err.value.field == "dtype" and "--engine sim" in str(err.value)
    result = CliRunner().invoke(app, ["roofline", "--model", "llama-3.3-70b", "--gpu", "b200", "--dtype", "fp4",
                                      "--compare", "none"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "FP4 GEMM 46%" in result.stdout and "B200 in fp4: MAPE " in result.stdout


def test_presets_carry_their_sources_and_b200_is_one() -> None:
    b200 = load_hardware("b200")
    assert (b200.peak_flops, b200.peak_flops_fp8, b200.mem_bw) == (2250e12, 4500e12, 8e12)
    for hw in (*GPUS.values(), *SEEDS.values()):
        for name in ("peak_flops", "peak_flops_fp8", "mem_bw", "memory_bytes", "link_bw", "gemm_eff", "mem_eff"):
            assert hw.sources.get(name), (hw.name, name)
    assert "datasheet" in GPUS["h200"].sources["mem_bw"] and "4.8 TB/s" in GPUS["h200"].sources["mem_bw"]
    assert "fitted" in GPUS["a100"].sources["gemm_eff"] and "assumed" in GPUS["h100"].sources["gemm_eff"]
    seeds = load_hardware("h100-seeds")
    assert (seeds.gemm_eff, seeds.mem_eff, seeds.cost_model, seeds.counting) == (0.4, 0.8, "roofline", "textbook")


def test_gemm_time_falls_from_peak_at_few_rows_and_cuda_graphs_cut_the_decode_step_overhead() -> None:
    a100 = GPUS["a100"]
    cm = CostModel.for_hardware(PRESETS["llama-3-8b"], a100)
    weights = 4096 * 28672 * 2
    one_row = gemm_seconds(cm, "gate_up", 1, a100)
    assert weights / a100.mem_bw < one_row < 1.5 * weights / a100.mem_bw  # a bandwidth-bound weight stream
    flops = 2 * 28672 * 4096

    def share_of_peak(rows: int) -> float:
        return rows * flops / gemm_seconds(cm, "gate_up", rows, a100) / a100.peak_flops

    assert share_of_peak(64) < 0.7 * share_of_peak(32768) and share_of_peak(32768) > 0.6
    eager = CostModel.for_hardware(PRESETS["llama-3-8b"], a100, cuda_graphs=False)
    decode, chunk = StepShape.decode(8, 512), StepShape.prefill(64)
    saved = eager.time(decode, a100).total_s - cm.time(decode, a100).total_s
    assert saved == pytest.approx(a100.step_overhead_s - a100.graph_step_overhead_s)
    assert eager.time(chunk, a100).total_s == cm.time(chunk, a100).total_s  # prefill steps run eagerly anyway


def test_a_16_bit_gemm_a_few_rows_past_a_tile_computes_the_whole_next_tile() -> None:
    """Vidur's cuBLAS profiles step at multiples of 128 rows: 136 rows take what 256 take once compute-bound,
    128 rows what they are. Without the tile, or under fp8 (no rounding measured), time grows with the rows."""
    a100 = GPUS["a100"]
    cm = CostModel.for_hardware(PRESETS["llama-3-8b"], a100)
    t = {rows: gemm_seconds(cm, "gate_up", rows, a100) for rows in (120, 128, 136, 256, 264, 384)}
    assert a100.gemm_tile == 128 and "Vidur" in a100.sources["gemm_tile_rows"]
    assert t[120] < t[128] < 1.1 * t[120]  # within one tile: no step
    assert t[136] == pytest.approx(t[256], rel=0.01) and t[136] > 1.4 * t[128]
    assert t[264] == pytest.approx(t[384], rel=0.01) and t[264] > 1.3 * t[256]
    untiled = a100.with_(gemm_tile_rows=0)
    assert gemm_seconds(cm, "gate_up", 136, untiled) < 1.05 * t[128]
    fp8 = GPUS["h100"].for_dtype("fp8")
    cm8 = CostModel.for_hardware(PRESETS["llama-3-8b"], fp8)
    assert fp8.gemm_tile == 0 and gemm_seconds(cm8, "gate_up", 520, fp8) < 1.05 * gemm_seconds(cm8, "gate_up", 512, fp8)
    assert SEEDS["h100-seeds"].gemm_tile == 0  # the source documents' arithmetic stays untouched
    with pytest.raises(ConfigError) as err:
        a100.with_(gemm_tile_rows=-1)
    assert err.value.field == "gpu.gemm_tile_rows"


def test_past_two_tiles_a_hopper_gemm_computes_whole_256_row_clusters() -> None:
    """Vidur's H100 profiles step at multiples of 256 rows past 256 (a layer 8 rows past 512 takes 1.5-1.7x the
    layer at 512): Hopper pairs two 128-row tiles in a cluster. The A100 keeps 128-row steps; fp8 stays unrounded."""
    h100, h200, a100 = GPUS["h100"], GPUS["h200"], GPUS["a100"]
    assert h100.gemm_cluster_rows == h200.gemm_cluster_rows == 256 and a100.gemm_cluster_rows == 0
    assert "cluster" in h100.sources["gemm_cluster_rows"] and not a100.sources["gemm_cluster_rows"]
    computed = {rows: (h100.gemm_rows_computed(rows), a100.gemm_rows_computed(rows))
                for rows in (1, 128, 136, 256, 264, 384, 512, 520, 1000)}
    assert computed == {1: (1, 1), 128: (128, 128), 136: (256, 256), 256: (256, 256), 264: (512, 384),
                        384: (512, 384), 512: (512, 512), 520: (768, 640), 1000: (1024, 1024)}
    cm = CostModel.for_hardware(PRESETS["llama-3-8b"], h100)
    t = {rows: gemm_seconds(cm, "gate_up", rows, h100) for rows in (264, 512, 520)}
    assert t[264] == pytest.approx(t[512], rel=0.01) and t[520] > 1.4 * t[512]
    assert h100.for_dtype("fp8").gemm_rows_computed(520) == 520
    assert SEEDS["h100-seeds"].gemm_rows_computed(520) == 520
    with pytest.raises(ConfigError) as err:
        h100.with_(gemm_cluster_rows=-256)
    assert err.value.field == "gpu.gemm_cluster_rows"


def test_an_a100_gemm_of_993_to_1024_rows_runs_cublass_slower_kernel() -> None:
    """Vidur's A100 profiles run 993-1,024 rows slower than their neighbours (a slower cuBLAS kernel): those
    rows compute 1.06x as long on the A100 presets, not at 992 or 1,025, not under fp8 nor on other GPUs."""
    a100, pcie, h100 = GPUS["a100"], GPUS["a100-pcie"], GPUS["h100"]
    assert a100.gemm_slow_rows == pcie.gemm_slow_rows == (993, 1024, 1.06) and h100.gemm_slow_rows == (0, 0, 1.0)
    assert "Vidur" in a100.sources["gemm_slow_rows"] and not h100.sources["gemm_slow_rows"]
    assert [a100.gemm_slowdown(r) for r in (992, 993, 1023, 1024, 1025)] == [1.0, 1.06, 1.06, 1.06, 1.0]
    assert a100.with_(dtype="fp8").gemm_slowdown(1024) == 1.0 and h100.gemm_slowdown(1024) == 1.0
    cm = CostModel.for_hardware(PRESETS["llama-3-8b"], a100)
    plain = a100.with_(gemm_slow_rows=(0, 0, 1.0))
    assert gemm_parts(cm, 1024, 4096, 4096, a100)[0] == pytest.approx(1.06 * gemm_parts(cm, 1024, 4096, 4096, plain)[0])
    assert gemm_parts(cm, 1025, 4096, 4096, a100) == gemm_parts(cm, 1025, 4096, 4096, plain)
    assert Hardware.from_dict(json.loads(json.dumps(a100.to_dict()))) == a100  # a saved profile's list reads back
    for bad in ((1024, 993, 1.06), (0, 0, 0.5), "slow", 7):
        with pytest.raises(ConfigError) as err:
            a100.with_(gemm_slow_rows=bad)
        assert err.value.field == "gpu.gemm_slow_rows"


def test_tp_leaves_the_schedulers_decisions_unchanged() -> None:
    """Same K/V blocks, same requests: the step sequence is identical at tp 1 and 2; only durations move."""
    def steps(tp: int) -> tuple[list[tuple], list[float]]:
        engine = offline_engine(EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", tp=tp, kv_blocks=400,
                                             chunk_budget=512, max_model_len=4096))
        for i in range(6):
            engine.add_request(list(range(3 + i, 3 + i + 300 * (i + 1))), SamplingParams(max_tokens=20, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        recs = engine.step_log.since(0)
        keys = ("phase", "prefill_tokens", "decode_tokens", "num_running", "num_waiting", "num_preemptions")
        return [tuple(getattr(r, k) for k in keys) for r in recs], [r.duration_s for r in recs]

    (d1, t1), (d2, t2) = steps(1), steps(2)
    assert d1 == d2 and any(r[5] for r in d1)  # preemptions included
    assert t1 != t2  # the durations are TP's: half the work per GPU, plus 64 all-reduces a step


def test_70b_tp2_fp8_five_thousand_token_prompts_simulate_in_seconds(tmp_path: Path) -> None:
    cfg = {"vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
           "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 131072,
           "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = str(tmp_path / "config.json")
    assert load_model_config(model).num_layers == 80
    t0 = time.perf_counter()
    engine = offline_engine(EngineConfig(model=model, engine="sim", gpu="h100", tp=2, dtype="fp8"))
    for i in range(8):
        engine.add_request([5 + (i * 7 + j) % 1000 for j in range(5000)], SamplingParams(max_tokens=50, ignore_eos=True))
    first: dict[str, int] = {}
    while engine.has_unfinished():
        for out in engine.step():
            first.setdefault(out.request_id, out.time_ns)
    assert len(first) == 8 and time.perf_counter() - t0 < 20
    decode = [r.duration_s for r in engine.step_log.since(0) if r.phase == "decode"]
    assert 0.005 < min(decode) < 0.05  # an ITL of milliseconds to tens: 70 GB of fp8 weights over 2 GPUs


def test_roofline_command_takes_tp_and_dtype() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["roofline", "--model", "llama-2-70b", "--gpu", "h100", "--tp", "2", "--dtype", "fp8",
                                 "--compare", "h100,a100,b200", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    cm = CostModel.for_hardware(L70, H100.for_dtype("fp8"), tp=2)
    assert doc["tp"] == 2 and doc["weight_bytes_per_gpu"] == pytest.approx(cm.weight_bytes_per_gpu)
    assert doc["hardware"]["dtype"] == "fp8" and [g["gpu"] for g in doc["gpus"]] == ["h100", "a100", "b200"]
    # the step times hold the all-reduces the FLOPs and bytes do not explain, and the table says how much
    prefill = doc["phases"][0]
    assert prefill["estimated_allreduce_s"] == pytest.approx(
        2 * L70.num_layers * cm.allreduce_s(prefill["tokens"], H100.for_dtype("fp8")))
    assert 0 < prefill["roofline_allreduce_s"] < prefill["roofline_time_s"]
    text = " ".join(runner.invoke(app, ["roofline", "--model", "llama-2-70b", "--gpu", "h100", "--tp", "2",
                                        "--compare", "none"]).output.split())
    assert "per GPU at TP 2; the times include two all-reduces a layer" in text and "ms all-reduce)" in text
    mixed = json.loads(runner.invoke(app, ["roofline", "--model", "llama-2-70b", "--gpu", "h100", "--tp", "2", "--dtype",
                                           "fp8", "--kv-cache-dtype", "bfloat16", "--compare", "none", "--json"]).stdout)
    assert mixed["kv_bytes_per_token"] == 2 * doc["kv_bytes_per_token"]
    assert (mixed["kv_bytes_per_element"], doc["kv_bytes_per_element"]) == (2, 1)
    assert mixed["kv_capacity_tokens"] == pytest.approx(doc["kv_capacity_tokens"] / 2, abs=1)
    result = runner.invoke(app, ["roofline", "--model", "llama-2-70b", "--tp", "3"])
    assert result.exit_code == 2 and "tp" in result.output and "divide" in result.output


def test_calibrate_at_tp_fits_per_gpu_costs(tmp_path: Path) -> None:
    import polars as pl

    from itlbench.sim.calibrate import RunSteps, step_data

    steps = pl.DataFrame({"prefill_tokens": [512, 0], "decode_tokens": [0, 8], "num_sampled": [1, 8],
                          "context_tokens": [0, 8 * 600], "attention_pairs": [512 * 513 // 2, 8 * 601],
                          "num_prefill_reqs": [1, 0], "num_decode_reqs": [0, 8], "start_ns": [0, 10],
                          "end_ns": [5, 12], "phase": ["prefill", "decode"]})
    run = RunSteps(tmp_path, L70, "bfloat16", "cuda", steps)
    one, two = step_data(run), step_data(run, tp=2)
    assert two.gemm_flops == pytest.approx(one.gemm_flops / 2) and two.attn_flops == pytest.approx(one.attn_flops / 2)
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path), "--tp", "0"])
    assert result.exit_code == 2 and "--tp" in result.output


def test_a_fitted_preset_round_trips_through_a_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "b200.json"
    GPUS["b200"].save(path)
    assert load_hardware(str(path)) == GPUS["b200"]  # sources, link, fp8 rate and operator fields included
    nccl = GPUS["h100"].with_(name="nccl-allreduce", link_latency_s=65e-6)  # an engine all-reducing with NCCL
    nccl.save(path)
    cm = CostModel.for_hardware(L70, nccl, tp=4)
    assert cm.allreduce_s(1, load_hardware(str(path))) > cm.allreduce_s(1, GPUS["h100"]) + 50e-6
