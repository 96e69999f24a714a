"""The window's GPU figures: energy from the counter or from power, per output token, and 'no NVML' lines."""

from __future__ import annotations

import polars as pl
import pytest

from itlbench.analysis.gpu import energy_j, gpu_line, gpu_summary
from itlbench.analysis.window import RunWindow
from itlbench.rundir import empty, frame

S = 1_000_000_000


def _samples(power: list[float], energy: list[float | None], start_s: int = 0) -> pl.DataFrame:
    return frame("gpu_samples", [{"t_ns": (start_s + i) * S, "device": 0, "power_w": p, "sm_util": 80.0,
                                  "mem_util": 40.0, "energy_j": e} for i, (p, e) in enumerate(zip(power, energy, strict=True))])


def test_energy_integrates_power_where_the_counter_is_missing() -> None:
    samples = _samples([100.0, 300.0, 300.0], [None, None, None])
    assert energy_j(samples) == pytest.approx(200.0 + 300.0)
    assert energy_j(samples.head(1)) is None
    assert gpu_summary(samples, None, 0, "NVML")["energy_per_output_token_j"] is None


def test_the_counter_wins_and_only_the_window_counts() -> None:
    samples = _samples([400.0] * 10, [1000.0 + 350.0 * i for i in range(10)])  # 350 J/s by the counter
    window = RunWindow(0, 2 * S, 7 * S)  # samples at 2..6 s
    g = gpu_summary(samples, window, output_tokens=700, status="NVML")
    assert g["samples"] == 5 and g["energy_j"] == pytest.approx(4 * 350.0)
    assert g["energy_per_output_token_j"] == pytest.approx(4 * 350.0 / 700)
    assert g["power_w_mean"] == 400.0 and g["sm_util_mean"] == 80.0 and g["mem_util_mean"] == 40.0
    assert gpu_line(g) == "400 W mean, SM 80 %, memory 40 %, 1,400 J, 2 J per output token (5 NVML samples)"


def test_without_samples_the_summary_says_why() -> None:
    why = "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    assert gpu_summary(empty("gpu_samples"), None, 100, why) == {"nvml": why}
    assert gpu_summary(empty("gpu_samples"), None, 100, "NVML") == {
        "nvml": "no NVML: no GPU samples in the measured window"}
    assert gpu_summary(empty("gpu_samples"), None, 100, None)["nvml"].startswith("no NVML: run.json records no")
    assert gpu_line({"nvml": why}) == why and gpu_line(None).startswith("no NVML")
