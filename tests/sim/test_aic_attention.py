"""Attention whose prefill efficiency rises with the keys a query reads (`Hardware.attn_k_half`), and
`benchmarks/aic_attention.py` as a user runs it on a table tree laid out as ai-dynamo/aiconfigurator's.

The tables' times are a known profile's own predictions, so what the script must print and fit is known in advance; the
real tables are not in this repo (docs/perf/sim-vs-published.md has the figures measured against them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from benchmarks.aic_attention import L2_BYTES, predicted_s, roofs
from benchmarks.aic_gemms import DATA
from itlbench.core.presets import PRESETS
from itlbench.errors import ConfigError
from itlbench.sim.hardware import load_hardware, presets
from itlbench.sim.operators import attention_parts
from itlbench.sim.roofline import CostModel
from itlbench.sim.shapes import StepShape

HEAD_BYTES = 2 * 128 * 2  # K and V of one head, 16-bit
LENGTHS = (128, 512, 1024, 2048, 4096, 8192, 16384)
CACHED = (1000, 4000, 16000, 60000)  # none at the L2 cut: b x (n + 1) x K/V bytes a token


def test_prefill_attention_speeds_up_with_the_keys_each_query_reads_where_the_profile_says_so() -> None:
    """A fresh prompt of n tokens reads (n + 1) / 2 keys a query on average: at attn_k_half 600 a 1k prompt runs at
    46 % of attn_eff and a 16k one at 93 %. A profile with attn_k_half 0 keeps one efficiency at every length; decode,
    whose queries read the whole context, is all but unchanged."""
    model = PRESETS["llama-3.1-8b"]
    flat = presets()["h100"].for_dtype("bfloat16").with_(attn_k_half=0.0)
    ramp = flat.with_(attn_eff=0.7, attn_k_half=600.0)
    cm = CostModel.for_hardware(model, flat, tp=1)
    for n in (1024, 16384):
        shape = StepShape.prefill(n)
        ideal = attention_parts(cm, shape, flat.with_(attn_eff=1.0))[0]
        keys = shape.attention_pairs / shape.tokens
        assert attention_parts(cm, shape, flat)[0] == pytest.approx(ideal / flat.attn_eff)
        assert attention_parts(cm, shape, ramp)[0] == pytest.approx(ideal / (0.7 * keys / (keys + 600)))
    short, long = (attention_parts(cm, StepShape.prefill(n), ramp)[0] / attention_parts(cm, StepShape.prefill(n),
                                                                                        ramp.with_(attn_k_half=0.0))[0]
                   for n in (1024, 16384))
    assert short == pytest.approx((512.5 + 600) / 512.5) and long == pytest.approx((8192.5 + 600) / 8192.5)
    decode = StepShape.decode(64, 4096)
    assert attention_parts(cm, decode, ramp)[0] == pytest.approx(attention_parts(cm, decode, ramp.with_(
        attn_k_half=0.0))[0] * (4097 + 600) / 4097)


def test_the_presets_and_their_2025_profiles_share_vllms_ramp_and_differ_in_its_height() -> None:
    """Each preset takes the ramp fitted on vLLM's kernel of its GPU (the A100 PCIe the A100's, the RTX 4090 the
    L40S's), with attn_eff refitted on the published figures (0.37); its `-2025` profile the same ramp at the kernel's
    own height (H100: 0.695), so a prompt's attention on `h100-2025` is 0.53 of the preset's at any length."""
    from itlbench.sim.hardware import ATTENTION_2025

    for name, hw in presets().items():
        assert hw.attn_k_half == ATTENTION_2025[{"a100-pcie": "a100", "rtx4090": "l40s"}.get(name, name)][1] > 0
    model = PRESETS["llama-3.1-8b"]
    times = {}
    for name in ("h100", "h100-2025"):
        hw = load_hardware(name)
        cm = CostModel.for_hardware(model, hw, tp=1)
        times[name] = [attention_parts(cm, StepShape.prefill(n), hw)[0] for n in (128, 2048, 32768)]
    ratio = presets()["h100"].attn_eff / 0.695
    assert [a / b for a, b in zip(times["h100-2025"], times["h100"], strict=True)] == pytest.approx([ratio] * 3)
    assert ratio < 0.6


def test_the_ramp_survives_a_profile_json_and_a_negative_one_is_one_line(tmp_path: Path) -> None:
    hw = load_hardware("h100-2025")
    path = tmp_path / "h100-2025.json"
    hw.save(path)
    assert load_hardware(str(path)).attn_k_half == hw.attn_k_half > 0
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "attn_k_half": -1}))
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    assert err.value.field == "--gpu" and "\n" not in str(err.value)  # the flag that named the file, then the file and key
    assert err.value.problem == f"{path}: attn_k_half must be >= 0, got -1" and "the h100 preset's" in err.value.fix


# ---- benchmarks/aic_attention.py --------------------------------------------------------------------------


def _frame(phase: str, lengths: tuple[int, ...], batches: tuple[int, ...]) -> pl.DataFrame:
    rows = [{"num_heads": h, "num_key_value_heads": kv, "batch_size": b, "length": n}
            for h, kv in ((32, 8), (8, 1)) for b in batches for n in lengths]
    return pl.DataFrame(rows)


def _write(path: Path, phase: str, hw_name: str, fast: float = 1.0, **terms: float) -> None:
    """One table as the collector files it, timed as the named profile (with `terms` changed) predicts, `fast` times
    faster; plus rows the script must not read (head_dim 64, an fp8 cache, a sliding window)."""
    hw = load_hardware(hw_name).for_dtype("bfloat16").with_(**terms)
    frame = _frame(phase, LENGTHS if phase == "context" else CACHED, (1, 4) if phase == "context" else (1, 8, 64))
    seconds = predicted_s(hw, phase, frame) / fast
    rows = []
    for (h, kv, b, n), s in zip(frame.iter_rows(), seconds, strict=True):
        isl, step = (n, 0) if phase == "context" else (1, n)
        base = {"kernel_source": "fa3", "batch_size": b, "isl": isl, "step": step, "num_heads": h,
                "num_key_value_heads": kv, "head_dim": 128, "kv_cache_dtype": "bfloat16", "window_size": 0,
                "latency": s * 1e3}
        rows += [base, {**base, "head_dim": 64, "latency": s}, {**base, "kv_cache_dtype": "fp8", "latency": s},
                 {**base, "window_size": 128, "latency": s}]
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(path)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/aic_attention.py", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_fit_recovers_the_terms_a_table_was_timed_with_and_the_preset_errs_as_built(tmp_path: Path) -> None:
    folder = tmp_path / DATA / "h100_sxm" / "attention" / "vllm" / "0.24.0"
    _write(folder / "context_attention_perf.parquet", "context", "h100", attn_eff=0.6, attn_k_half=400.0)
    _write(folder / "generation_attention_perf.parquet", "generation", "h100", attn_mem_eff=0.8)
    proc = _run("--aic", str(tmp_path), "--fit", "--markdown", str(tmp_path / "t.md"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"h100 vllm 0.24.0 context fa3: {28:5d} rows:"), proc.stdout  # 2 heads x 2 batches x 7
    # the preset (attn_eff 0.3693, k_half 600) against the table's 0.6 and 400: slower everywhere, at 16,384 tokens
    # (8,192.5 keys a query) 0.6 x 8,192.5 / 8,592.5 over 0.3693 x 8,192.5 / 8,792.5 = 1.66 times
    assert presets()["h100"].attn_eff == 0.3693 and "8193-131072 +66%" in lines[1], lines[1]
    assert "fitted attn_eff 0.600, attn_k_half 400:" in lines[2] and "MAPE  0.0%" in lines[2], lines[2]
    # decode: the rows whose K/V would sit in L2 are left out (7 of 24 read; see the test below)
    assert lines[3].startswith(f"h100 vllm 0.24.0 generation fa3: {7:5d} rows:") and "17 rows left out" in lines[3], lines[3]
    assert "fitted attn_mem_eff 0.800:" in lines[5] and "MAPE  0.0%" in lines[5], lines[5]
    assert (tmp_path / "t.md").read_text().startswith("```text\nh100 vllm 0.24.0 context fa3:")


def test_the_2025_profiles_read_back_their_own_tables_and_impossible_ones_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / DATA
    _write(root / "h100_sxm" / "attention" / "vllm" / "0.24.0" / "context_attention_perf.parquet", "context",
           "h100-2025")
    _write(root / "a100_sxm" / "attention" / "sglang" / "0.5.9" / "context_attention_perf.parquet", "context",
           "a100", fast=5.0)  # five times faster than the preset at attn_eff 0.36: beyond the A100's peak
    _write(root / "b60" / "attention" / "vllm" / "0.24.0" / "context_attention_perf.parquet", "context", "h100")
    proc = _run("--aic", str(tmp_path), "--kernels", "2025")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("a100-2025 sglang 0.5.9 context fa3: skipped,") and "faster than the datasheet" in lines[0]
    assert lines[1].startswith("h100-2025 vllm 0.24.0 context fa3:") and "MAPE  0.0%" in lines[1], proc.stdout
    assert not any(line.startswith("b60") for line in lines)  # no preset for that GPU


def test_decode_rows_small_enough_to_sit_in_l2_are_the_ones_left_out() -> None:
    hw = load_hardware("h100").for_dtype("bfloat16")
    frame = _frame("generation", CACHED, (1, 8, 64))
    kv_bytes = roofs(hw, "generation", frame)[:, 1] * hw.mem_bw
    k_v = [b * (n + 1) * kv * HEAD_BYTES for _, kv, b, n in frame.iter_rows()]  # K and V of every cached token
    assert list(kv_bytes >= L2_BYTES) == [x >= L2_BYTES for x in k_v] and sum(x >= L2_BYTES for x in k_v) == 7

