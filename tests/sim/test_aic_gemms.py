"""`benchmarks/aic_gemms.py` as a user runs it, on a table tree laid out as ai-dynamo/aiconfigurator's.

The tables' times are the presets' own predictions divided by known factors, so the errors the script must print
are known in advance; the real tables are not in this repo (docs/perf/sim-vs-published.md has the figures
measured against them)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl

from benchmarks.aic_gemms import DATA, predicted_s
from itlbench.core.presets import PRESETS
from itlbench.sim.hardware import presets
from itlbench.sim.roofline import CostModel

ROWS = (1, 8, 64, 128, 129, 256, 257, 512, 513, 1024, 2048, 4096)
SHAPES = ((4096, 4096), (6144, 4096), (4096, 14336), (1024, 4096))  # (n, k); the last is narrower than --min-nk


def _write_table(path: Path, gpu: str, fast_from: int) -> None:
    """One gemm_perf.parquet: bfloat16 rows as the preset predicts them, except from `fast_from` rows on, where the
    kernel is 20 % faster (so the model errs +25 %), and each row one past a tile, timed as the tile itself (a
    kernel with no tile rounding). fp8_block rows, a format no preset prices, are left out of the comparison."""
    hw = presets()[gpu].for_dtype("bfloat16")
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], hw, tp=1)
    rows = []
    for n, k in SHAPES:
        for m in ROWS:
            base = m - 1 if m - 1 in ROWS and (m - 1) % 128 == 0 else m
            ms = 1e3 * predicted_s(cm, hw, base, n, k) / (1.25 if base >= fast_from else 1.0)
            rows += [{"gemm_dtype": "bfloat16", "m": m, "n": n, "k": k, "latency": ms},
                     {"gemm_dtype": "fp8_block", "m": m, "n": n, "k": k, "latency": ms / 3}]
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(path)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/aic_gemms.py", *args], capture_output=True, text=True,
                          timeout=120)


def test_every_table_on_a_preset_gpu_is_compared_and_the_errors_come_out_as_built(tmp_path: Path) -> None:
    root = tmp_path / DATA
    _write_table(root / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet", "h100", fast_from=512)
    _write_table(root / "b60" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet", "h100", fast_from=1)  # no preset
    proc = _run("--aic", str(tmp_path), "--markdown", str(tmp_path / "t.md"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("h100 vllm 0.24.0 bfloat16:"), proc.stdout  # b60, fp8_block: not
    shapes = 3 * len(ROWS)  # n and k of 4,096 or more
    assert f"{shapes:6d} shapes:" in lines[0]
    # 1, 8, 64, 128 and 256 exact; 129 and 257, timed as 128 and 256, over by the preset's rounding; 512 on +25 %:
    # 7 of 12 rows a shape over 15 %
    assert f"{7 / 12:5.1%} over 15 %" in lines[0]
    assert "1-16 +0%" in lines[1] and "17-128 +0%" in lines[1] and "2049-4353 +25%" in lines[1]
    # one row past 128 and 256 is timed as the tile: 1.00 measured, against the preset's tile and cluster rounding
    hw = presets()["h100"].for_dtype("bfloat16")
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], hw, tp=1)
    for m in (128, 256, 512):
        rounding = statistics.median(predicted_s(cm, hw, m + 1, n, k) / predicted_s(cm, hw, m, n, k)
                                     for n, k in SHAPES[:3])
        assert rounding > 1.15 and f"{m}: 1.00 vs {rounding:.2f}" in lines[2], lines[2]
    assert (tmp_path / "t.md").read_text().startswith("```text\nh100 vllm 0.24.0 bfloat16:")


def test_a_path_that_is_no_clone_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    proc = _run("--aic", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"error: --aic: {tmp_path} has no {DATA} (give a clone of "
                                                "ai-dynamo/aiconfigurator)"]
