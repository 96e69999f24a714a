"""GPU telemetry through NVML (`nvidia-ml-py`, optional): power, SM and memory utilisation, energy.

Import-guarded: without the package, without a driver, or without a GPU, `nvml_status()` says why in
one line starting "no NVML" and `GpuSampler` records nothing, so a CPU run carries on and its summary
says so instead of showing zeros. With NVML, `GpuSampler` polls one device on a thread beside the
engine (every `interval_s`; NVML refreshes power about every 20-100 ms) and hands each sample to a
sink (the run's `gpu_samples` table, on the perf_counter clock the step log uses), so the power
figures line up with the steps. The window's figures are computed in `analysis/gpu.py`.
Lives with the other observers, not under `telemetry/`: it runs in every CUDA run, and nothing of
`telemetry/` may load unless live export is asked for.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

GPU_SAMPLE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class GpuSample:
    t_ns: int
    power_w: float
    sm_util: float  # % of the sample period a kernel ran
    mem_util: float  # % of the period device memory was read or written
    energy_j: float | None  # the device's cumulative counter, None where it has none

    def row(self, device: int) -> dict[str, Any]:
        return {**asdict(self), "device": device}


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


def nvml_index(device: str) -> int:
    """NVML's index of a torch device ('cuda', 'cuda:1'): NVML ignores CUDA_VISIBLE_DEVICES, so a
    numeric entry there maps the CUDA index back to the physical one."""
    tail = device.rsplit(":", 1)[-1] if ":" in device else ""
    cuda = int(tail) if tail.isdigit() else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda < len(visible) and visible[cuda].isdigit():
        return int(visible[cuda])
    return cuda


def why_not_sampled(engine_device: str | None, external: bool) -> str | None:
    """None when the run's engine is on a local CUDA device (sample it), else the 'no NVML' line that
    says why a run has no GPU figures, without loading NVML. `engine_device` of an external endpoint is what an
    itlbench server reports, None for other servers."""
    device = (engine_device or "").lower()
    if device.startswith("sim"):  # an endpoint that is itlbench's served simulator says so in GET /v1/engine
        if external:
            return f"no NVML: the endpoint is itlbench's simulated engine ({engine_device}), which runs on no GPU"
        return f"no NVML: the simulated engine ({engine_device}) runs on no GPU"
    if external:
        return "no NVML: the engine is an external endpoint (its GPU may be on another machine; not sampled)"
    if not device.startswith("cuda"):
        return f"no NVML: the engine runs on {engine_device or 'an unknown device'}, not a GPU"
    return None


@dataclass
class GpuSampler:
    """Samples one GPU on a background thread between `start()` and `stop()` (or as a context manager);
    `status` is 'NVML' once sampling, else the reason it is not."""

    device_index: int = 0
    interval_s: float = GPU_SAMPLE_INTERVAL_S
    sink: Callable[[dict[str, Any]], None] | None = None  # gets each sample as a gpu_samples row
    samples: list[GpuSample] = field(default_factory=list)
    status: str = ""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> GpuSampler:
        nvml, self.status = _load_nvml()
        if nvml is None:
            return self
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:  # an index the driver does not have
            self.status = f"no NVML: GPU {self.device_index}: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, args=(nvml, handle), name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self, nvml: Any, handle: Any) -> None:  # noqa: ANN401 - NVML's own types
        while not self._stop.is_set():
            try:
                sample = read_sample(nvml, handle)
            except Exception as exc:  # a GPU lost mid-run: say so, keep what was sampled
                self.status = f"no NVML: sampling stopped: {exc}" if not self.samples else self.status
                return
            self.samples.append(sample)
            if self.sink is not None:
                self.sink(sample.row(self.device_index))
            self._stop.wait(self.interval_s)

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples

    def doc(self) -> dict[str, Any]:
        """What run.json records: the status line, the device and the period."""
        return {"nvml": self.status or "no NVML: not started", "device_index": self.device_index,
                "interval_s": self.interval_s, "samples": len(self.samples)}

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
