"""A stand-in NVML module (a test peer) for the GPU sampler's tests and the runs that use it."""

from __future__ import annotations

import types


class _Error(Exception):
    pass


def fake_nvml(count: int = 1, fail_init: bool = False, energy: bool = True) -> types.ModuleType:
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
