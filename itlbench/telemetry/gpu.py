"""GPU telemetry through NVML (`nvidia-ml-py`, optional): power, SM and memory utilisation, energy.

Import-guarded: without the package, without a driver, or without a GPU, `nvml_status()` says why in
one line starting "no NVML" and `GpuSampler` records nothing, so a CPU run carries on and its summary
says so instead of showing zeros. With NVML, `GpuSampler` polls one device on a thread beside the
engine (every `interval_s`; NVML refreshes power about every 20-100 ms) and `gpu_summary` turns the
samples into mean power and utilisation, energy, and energy per output token. Energy is the device's
own counter (`nvmlDeviceGetTotalEnergyConsumption`, Volta and later) where it has one, else the
power samples integrated over time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    time_ns: int
    power_w: float
    sm_util: float  # % of the sample period a kernel ran
    mem_util: float  # % of the period device memory was read or written
    energy_j: float | None  # the device's cumulative counter, None where it has none


def _load_nvml() -> tuple[ModuleType | None, str]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "no NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None, "no NVML: the driver sees no GPU"
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: the library says which
        return None, f"no NVML: {exc}"
    return pynvml, "NVML"


def nvml_status() -> str:
    """'NVML' when GPU telemetry works here, else one line starting 'no NVML' that says why."""
    return _load_nvml()[1]


@dataclass
class GpuSampler:
    """Samples one GPU on a background thread between `start()` and `stop()` (or as a context manager)."""

    device_index: int = 0
    interval_s: float = 0.1
    samples: list[GpuSample] = field(default_factory=list)
    status: str = ""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> GpuSampler:
        nvml, self.status = _load_nvml()
        if nvml is None:
            return self
        handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        self._thread = threading.Thread(target=self._run, args=(nvml, handle), name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self, nvml: Any, handle: Any) -> None:  # noqa: ANN401 - NVML's own types
        while not self._stop.is_set():
            self.samples.append(read_sample(nvml, handle))
            self._stop.wait(self.interval_s)

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_sample(nvml: Any, handle: Any) -> GpuSample:  # noqa: ANN401
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    try:
        energy: float | None = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ
    except Exception:  # not supported before Volta
        energy = None
    return GpuSample(time.perf_counter_ns(), nvml.nvmlDeviceGetPowerUsage(handle) / 1e3, float(util.gpu),
                     float(util.memory), energy)


def energy_j(samples: list[GpuSample]) -> float | None:
    """Joules between the first and last sample: the counter's difference, else trapezoids of power."""
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    if first.energy_j is not None and last.energy_j is not None:
        return last.energy_j - first.energy_j
    return sum((a.power_w + b.power_w) / 2 * (b.time_ns - a.time_ns) / 1e9 for a, b in pairwise(samples))


def gpu_summary(samples: list[GpuSample], output_tokens: int, status: str = "NVML") -> dict[str, Any]:
    """Mean power and utilisation, energy and energy per output token; or just why there is none."""
    if not samples or status != "NVML":
        return {"nvml": status or "no NVML: not sampled"}
    joules = energy_j(samples)
    n = len(samples)
    return {"nvml": "NVML", "samples": n, "power_w_mean": sum(s.power_w for s in samples) / n,
            "sm_util_mean": sum(s.sm_util for s in samples) / n, "mem_util_mean": sum(s.mem_util for s in samples) / n,
            "energy_j": joules,
            "energy_per_output_token_j": joules / output_tokens if joules is not None and output_tokens else None}
