"""GPU sampler: a clear 'no NVML' without the library or a GPU; samples to the sink with an NVML peer."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator

import pytest

from itlbench.load.observers.gpu_sampler import GpuSampler, nvml_index, nvml_status, why_not_sampled
from tests.support.nvml import fake_nvml


def test_without_nvidia_ml_py_the_status_says_so_and_nothing_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert nvml_status() == "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    rows: list[dict[str, object]] = []
    with GpuSampler(interval_s=0.001, sink=rows.append) as sampler:
        time.sleep(0.01)
    assert sampler.samples == [] and rows == [] and sampler.status.startswith("no NVML")
    assert sampler.doc()["nvml"] == sampler.status and sampler.doc()["samples"] == 0


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    fake = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


def test_a_driver_without_gpus_or_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail_init=True))
    assert nvml_status() == "no NVML: NVML Shared Library Not Found"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=0))
    assert nvml_status() == "no NVML: the driver sees no GPU"


def test_samples_reach_the_sink_as_gpu_samples_rows(nvml: types.ModuleType) -> None:
    assert nvml_status() == "NVML"
    rows: list[dict[str, object]] = []
    with GpuSampler(device_index=1, interval_s=0.002, sink=rows.append) as sampler:
        time.sleep(0.05)
    samples = sampler.samples
    assert len(samples) >= 3 and all(s.sm_util == 50 and s.mem_util == 20 for s in samples)
    assert [s.t_ns for s in samples] == sorted(s.t_ns for s in samples)
    assert len(rows) == len(samples) and rows[0]["device"] == 1
    assert set(rows[0]) == {"t_ns", "device", "power_w", "sm_util", "mem_util", "energy_j"}
    assert [r["energy_j"] for r in rows] == [float(i) for i in range(len(rows))]  # the 1 J/read counter
    assert sampler.doc() == {"nvml": "NVML", "device_index": 1, "interval_s": 0.002, "samples": len(samples)}


def test_which_runs_are_sampled_and_why_the_others_are_not() -> None:
    assert why_not_sampled("cuda:0", external=False) is None
    assert why_not_sampled("cuda", external=False) is None
    assert why_not_sampled("cpu", external=False) == "no NVML: the engine runs on cpu, not a GPU"
    assert why_not_sampled("sim:h100x2", external=False) == "no NVML: the simulated engine (sim:h100x2) runs on no GPU"
    assert why_not_sampled("sim:h100x2", external=True) == \
        "no NVML: the endpoint is itlbench's simulated engine (sim:h100x2), which runs on no GPU"
    assert why_not_sampled(None, external=True).startswith("no NVML: the engine is an external endpoint")


def test_nvml_indices_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_index("cuda") == 0 and nvml_index("cuda:1") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert nvml_index("cuda") == 3 and nvml_index("cuda:1") == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8c2f")  # UUIDs: NVML's order is not derivable here
    assert nvml_index("cuda:0") == 0
