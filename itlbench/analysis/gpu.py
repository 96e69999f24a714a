"""The window's GPU figures from the `gpu_samples` table: mean power and utilisation, energy, and
energy per output token; or, where the run has no samples, the 'no NVML' line saying why.

Energy is the device's own counter (`nvmlDeviceGetTotalEnergyConsumption`, Volta and later) where
it has one, else the power samples integrated by trapezoids. Per output token it divides by the
output tokens that arrived in the same window (the throughput's count), so J/token × tokens/s is the
mean power the tokens cost.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from itlbench.analysis.window import RunWindow


def energy_j(samples: pl.DataFrame) -> float | None:
    """Joules between the first and last sample: the counter's difference, else trapezoids of power."""
    if samples.height < 2:
        return None
    s = samples.sort("t_ns")
    first, last = s["energy_j"][0], s["energy_j"][-1]
    if first is not None and last is not None:
        return float(last - first)
    t, p = s["t_ns"].to_numpy(), s["power_w"].to_numpy()
    return float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1]) / 1e9).sum())


def gpu_status_of(meta: dict[str, Any]) -> str | None:
    """run.json's `gpu_telemetry.nvml`: why a run has no GPU samples ('NVML' where it sampled), None where
    run.json predates GPU telemetry."""
    doc = meta.get("gpu_telemetry")
    return doc.get("nvml") if isinstance(doc, dict) and isinstance(doc.get("nvml"), str) else None


def gpu_summary(samples: pl.DataFrame, window: RunWindow | None, output_tokens: float,
                status: str | None) -> dict[str, Any]:
    """`gpu.{nvml,samples,power_w_mean,sm_util_mean,mem_util_mean,energy_j,energy_per_output_token_j}`,
    or `gpu.nvml` alone ('no NVML: ...') when nothing was sampled in the window."""
    if window is not None:
        samples = samples.filter((pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    if samples.is_empty():
        if status is None:
            why = "no NVML: run.json records no GPU telemetry (a run from before it was sampled)"
        else:
            why = status if status != "NVML" else "no NVML: no GPU samples in the measured window"
        return {"nvml": why}
    joules = energy_j(samples)
    return {"nvml": "NVML", "samples": samples.height,
            "power_w_mean": float(samples["power_w"].mean()),  # type: ignore[arg-type]
            "sm_util_mean": float(samples["sm_util"].mean()),  # type: ignore[arg-type]
            "mem_util_mean": float(samples["mem_util"].mean()),  # type: ignore[arg-type]
            "energy_j": joules,
            "energy_per_output_token_j": joules / output_tokens if joules is not None and output_tokens else None}


def gpu_line(gpu: dict[str, Any] | None) -> str:
    """One line for the terminal and the report: the figures, or why there are none."""
    gpu = gpu or {}
    if gpu.get("nvml") != "NVML":
        return str(gpu.get("nvml") or "no NVML: not recorded (a run from before GPU telemetry)")
    per_tok = gpu.get("energy_per_output_token_j")
    energy = gpu.get("energy_j")
    return (f"{gpu['power_w_mean']:.0f} W mean, SM {gpu['sm_util_mean']:.0f} %, memory {gpu['mem_util_mean']:.0f} %"
            + (f", {energy:,.0f} J" if energy is not None else "")
            + (f", {per_tok:.3g} J per output token" if per_tok is not None else "")
            + f" ({gpu['samples']} NVML samples)")
