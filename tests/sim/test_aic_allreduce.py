"""`benchmarks/aic_allreduce.py` as a user runs it, on a table tree laid out as ai-dynamo/aiconfigurator's: tables
timed as the preset's link prices them, and as the `-2025` profile's measured table holds them, read back exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl

from benchmarks.aic_allreduce import predicted_s
from benchmarks.aic_gemms import DATA

ELEMENTS = (128, 2048, 32768, 524288, 8388608, 134217728)


def _write(path: Path, kind: str, seconds: dict[int, list[float]]) -> None:
    """One table as the collector files it: NCCL's (op, half) or an engine's (a graph and an eager row a size, the
    eager one 3x slower, which the script must skip)."""
    rows = []
    for tp, times in seconds.items():
        for e, t in zip(ELEMENTS, times, strict=True):
            if kind == "nccl":
                rows.append({"op_name": "all_reduce", "nccl_dtype": "half", "num_gpus": tp, "message_size": e,
                             "latency": t * 1e3})
            else:
                rows += [{"op_name": "all_reduce", "num_gpus": tp, "message_size": e, "latency": t * 1e3,
                          "backend": "vllm_graph"},
                         {"op_name": "all_reduce", "num_gpus": tp, "message_size": e, "latency": 3 * t * 1e3,
                          "backend": "vllm_eager"}]
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(path)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/aic_allreduce.py", *args], capture_output=True, text=True,
                          timeout=120)


def test_tables_timed_as_each_profile_prices_them_read_back_at_zero_error(tmp_path: Path) -> None:
    comm = tmp_path / DATA / "h100_sxm" / "comm"
    _write(comm / "nccl" / "2.27.3" / "nccl_perf.parquet", "nccl",
           {tp: [predicted_s("h100", tp, e) for e in ELEMENTS] for tp in (2, 8)})
    _write(comm / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet", "engine",
           {tp: [predicted_s("h100", tp, e, "2025") for e in ELEMENTS] for tp in (2, 8)})
    plain = _run("--aic", str(tmp_path))
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert [x.split(":")[0] for x in lines] == ["h100 nccl 2.27.3 tp2", "h100 nccl 2.27.3 tp8", "h100 vllm 0.24.0 tp2",
                                                "h100 vllm 0.24.0 tp8"]
    assert "<=64K +0%, 64K-1M +0%, 1M-16M +0%, >16M +0%" in lines[0]  # the preset against its own prices
    assert "1M-16M -" in lines[3]  # vLLM's measured mid-size all-reduces are slower than the preset's link price
    measured = _run("--aic", str(tmp_path), "--kernels", "2025")
    assert measured.returncode == 0, measured.stderr
    vllm = [x for x in measured.stdout.splitlines() if x.startswith("h100-2025 vllm")]
    # exact only if the eager rows (3x) were skipped: a median over both would read -50 %
    assert len(vllm) == 2 and all("<=64K +0%, 64K-1M +0%, 1M-16M +0%, >16M +0%" in x for x in vllm), vllm


def test_a_path_that_is_no_clone_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    proc = _run("--aic", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"error: --aic: {tmp_path} has no {DATA} (give a clone of "
                                                "ai-dynamo/aiconfigurator)"]
