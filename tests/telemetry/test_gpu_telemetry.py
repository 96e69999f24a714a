"""GPU telemetry: a clear 'no NVML' without the library or a GPU; sampling and energy with an NVML peer."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator

import pytest

from itlbench.telemetry.gpu import GpuSample, GpuSampler, energy_j, gpu_summary, nvml_status


def test_without_nvidia_ml_py_the_status_says_so_and_nothing_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert nvml_status() == "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    with GpuSampler(interval_s=0.001) as sampler:
        time.sleep(0.01)
    assert sampler.samples == [] and sampler.status.startswith("no NVML")
    assert gpu_summary(sampler.samples, 100, sampler.status) == {"nvml": sampler.status}


class _Error(Exception):
    pass


def _fake_nvml(count: int = 1, fail_init: bool = False, energy: bool = True) -> types.ModuleType:
    """A stand-in NVML (a test peer): 300 W rising 1 W per read, 50 % SM, 20 % memory, a 1 J/read counter."""
    m = types.ModuleType("pynvml")
    state = {"reads": 0}

    def init() -> None:
        if fail_init:
            raise _Error("NVML Shared Library Not Found")

    def power(handle: object) -> int:
        state["reads"] += 1
        return 300_000 + 1000 * state["reads"]  # mW

    def total_energy(handle: object) -> int:
        if not energy:
            raise _Error("Not Supported")
        return 1000 * state["reads"]  # mJ

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50, memory=20)
    m.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return m


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    fake = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


def test_a_driver_without_gpus_or_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail_init=True))
    assert nvml_status() == "no NVML: NVML Shared Library Not Found"
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(count=0))
    assert nvml_status() == "no NVML: the driver sees no GPU"


def test_sampling_power_utilisation_and_energy_per_token(nvml: types.ModuleType) -> None:
    assert nvml_status() == "NVML"
    with GpuSampler(interval_s=0.002) as sampler:
        time.sleep(0.05)
    samples = sampler.samples
    assert len(samples) >= 3 and all(s.sm_util == 50 and s.mem_util == 20 for s in samples)
    assert [s.time_ns for s in samples] == sorted(s.time_ns for s in samples)
    summary = gpu_summary(samples, output_tokens=10)
    assert summary["energy_j"] == pytest.approx(len(samples) - 1)  # the counter: 1 J per read
    assert summary["energy_per_output_token_j"] == pytest.approx((len(samples) - 1) / 10)
    assert 300 < summary["power_w_mean"] < 300 + len(samples) + 1


def test_energy_integrates_power_where_the_counter_is_missing() -> None:
    samples = [GpuSample(0, 100.0, 0, 0, None), GpuSample(1_000_000_000, 300.0, 0, 0, None),
               GpuSample(2_000_000_000, 300.0, 0, 0, None)]
    assert energy_j(samples) == pytest.approx(200.0 + 300.0)
    assert energy_j(samples[:1]) is None
    assert gpu_summary(samples, 0)["energy_per_output_token_j"] is None
