"""`benchmarks/vidur_dense.py` as a user runs it, on a profile tree laid out as microsoft/vidur's.

The profile's times are the presets' own predictions divided by known factors, so the errors the script
must print are known in advance; the real profiles are not in this repo (docs/perf/sim-vs-published.md
has the figures measured against them)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from itlbench.core.model_config import ModelConfig
from itlbench.sim.hardware import GPUS
from itlbench.sim.operators import gemm_seconds
from itlbench.sim.roofline import CostModel

OPS = {"qkv": "attn_pre_proj", "o": "attn_post_proj", "gate_up": "mlp_up_proj", "down": "mlp_down_proj"}
SHAPE = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336, "vocab_size": 128256}
ROWS = (1, 2, 4, 8, 16, 64, 128, 136, 256, 512, 1024, 2048)


def _write_profile(path: Path, slow_from: int, gated: bool = True, rows_profiled: tuple[int, ...] = ROWS,
                   spike: int | None = None) -> None:
    """One mlp.csv: every layer as the A100 preset predicts it, except rows >= slow_from, where the profile
    is 25 % faster than the prediction (so the model errs +25 % there), and the `spike` row, which takes
    1.5x. TP1 rows are profiled twice, at 0.9x and 1.1x of the target time (the script averages them)."""
    hw = GPUS["a100"].with_(dtype="float16")
    model = ModelConfig("t", SHAPE["vocab_size"], SHAPE["n_embd"], SHAPE["n_expanded_embd"], 1, SHAPE["n_head"],
                        SHAPE["n_kv_head"], 4096)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*(f"time_stats.{c}.median" for c in OPS.values()), *SHAPE, "use_gated_mlp", "num_tokens",
                    "num_tensor_parallel_workers"])
        for tp in (1, 2):
            cm = CostModel.for_hardware(model, hw, tp=tp)
            for rows in rows_profiled:
                factor = (1.25 if rows >= slow_from else 1.0) / (1.5 if rows == spike else 1.0)
                ms = [1e3 * gemm_seconds(cm, op, rows, hw) / factor for op in OPS]
                for spread in ((0.9, 1.1) if tp == 1 else (1.0,)):
                    w.writerow([*(m * spread for m in ms), *SHAPE.values(), gated, rows, tp])


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/vidur_dense.py", *args], capture_output=True, text=True,
                          timeout=120)


def test_every_profiled_row_is_compared_and_the_errors_come_out_as_built(tmp_path: Path) -> None:
    root = tmp_path / "data" / "profiling" / "compute"
    _write_profile(root / "a100" / "meta-llama" / "Test-8B" / "mlp.csv", slow_from=512)
    _write_profile(root / "a100" / "microsoft" / "not-gated" / "mlp.csv", slow_from=512, gated=False)
    _write_profile(root / "a40" / "meta-llama" / "Test-8B" / "mlp.csv", slow_from=1)  # no a40 preset: not read
    proc = _run("--vidur", str(tmp_path), "--markdown", str(tmp_path / "t.md"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "skipped a100/microsoft/not-gated: its MLP is not gated" in out and "a40" not in out
    n, slow = 2 * len(ROWS), 2 * sum(r >= 512 for r in ROWS)  # two degrees of TP
    m = re.search(r"held out\s+(\d+) layers: MAPE ([\d.]+)%, median ([\d.]+)%, signed median ([+-][\d.]+)%, (\d+)% over", out)
    assert m, out
    assert int(m[1]) == n
    assert float(m[2]) == pytest.approx(100 * 0.25 * slow / n, abs=0.1)
    assert int(m[5]) == round(100 * slow / n)
    a100 = next(line for line in out.splitlines() if line.startswith("a100 held out, median by rows"))
    assert "1 +0%" in a100 and "9-64 +0%" in a100 and "321-640 +25%" in a100 and "1281-2560 +25%" in a100
    rows = [line for line in out.splitlines() if line.startswith("a100/meta-llama/Test-8B")]
    assert len(rows) == 2 and all("held out" in r for r in rows)
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[0].startswith("| profile | TP | set | MAPE") and len(md) == 4


def test_the_profiles_the_stored_parameters_were_chosen_on_are_not_counted_as_held_out(tmp_path: Path) -> None:
    root = tmp_path / "data" / "profiling" / "compute"
    _write_profile(root / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv", slow_from=1)
    _write_profile(root / "h100" / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv", slow_from=1)
    _write_profile(root / "a100" / "m" / "Held-Out" / "mlp.csv", slow_from=10**9)
    out = _run("--vidur", str(tmp_path)).stdout
    chosen_on = [line for line in out.splitlines() if "Meta-Llama-3-8B" in line or "Llama-2-70b-hf" in line]
    assert len(chosen_on) == 4 and all("fit source" in line for line in chosen_on), out
    assert re.search(rf"held out\s+{2 * len(ROWS)} layers: MAPE 0.0%", out), out


def test_local_scatter_counts_the_layers_far_from_their_neighbours(tmp_path: Path) -> None:
    """Rows 264..384 every 8 rows (one 128-row tile: no step of the model's own between them), one of them
    (320) 1.5x its neighbours, at two degrees of TP: two layers off."""
    rows = tuple(range(264, 385, 8))
    _write_profile(tmp_path / "data" / "profiling" / "compute" / "a100" / "m" / "X" / "mlp.csv", slow_from=10**9,
                   rows_profiled=rows, spike=320)
    out = _run("--vidur", str(tmp_path)).stdout
    m = re.search(r"local scatter: (\d+) of (\d+) layers", out)
    assert m and int(m[1]) == 2 and int(m[2]) == 2 * len(rows), out


def test_a_fitted_parameter_can_be_replaced_for_the_comparison(tmp_path: Path) -> None:
    _write_profile(tmp_path / "data" / "profiling" / "compute" / "a100" / "m" / "X" / "mlp.csv", slow_from=10**9)
    same = _run("--vidur", str(tmp_path))
    assert "MAPE 0.0%" in same.stdout, same.stdout  # the profile is the stored presets' own prediction
    changed = _run("--vidur", str(tmp_path), "--set", "kernel_s=0")
    assert changed.returncode == 0 and "with kernel_s=0 (stored: kernel_s=5.142e-06)" in changed.stdout
    assert "MAPE 0.0%" not in changed.stdout


@pytest.mark.parametrize(("args", "names"), [
    (("--set", "no_such=1"), "'no_such' is not a fitted parameter"),
    (("--set", "kernel_s=fast"), "'fast' is not a number"),
    (("--set", "gemm_tile_rows=-1"), "gpu.gemm_tile_rows: must be a whole number >= 0"),
])
def test_bad_input_is_one_line_naming_the_flag(tmp_path: Path, args: tuple[str, ...], names: str) -> None:
    _write_profile(tmp_path / "data" / "profiling" / "compute" / "a100" / "m" / "X" / "mlp.csv", slow_from=1)
    proc = _run("--vidur", str(tmp_path), *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and names in proc.stderr and "--set" in proc.stderr


def test_a_tree_without_profiles_or_a_profile_without_its_columns_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("--vidur", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --vidur") and "microsoft/vidur" in proc.stderr
    bad = tmp_path / "data" / "profiling" / "compute" / "h100" / "m" / "X" / "mlp.csv"
    bad.parent.mkdir(parents=True)
    bad.write_text("num_tokens,num_tensor_parallel_workers\n1,1\n")
    proc = _run("--vidur", str(tmp_path))
    assert proc.returncode == 2 and str(bad) in proc.stderr and "lacks the columns" in proc.stderr
    assert proc.stderr.count("\n") == 1
    _write_profile(bad, slow_from=1, rows_profiled=())  # the header alone
    proc = _run("--vidur", str(tmp_path))
    assert proc.returncode == 2 and "holds no profiled rows" in proc.stderr and proc.stderr.count("\n") == 1
    bad.write_bytes(b"\xff\xfe\x00garbage\n\x00\x01")
    proc = _run("--vidur", str(tmp_path))
    assert proc.returncode == 2 and str(bad) in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
