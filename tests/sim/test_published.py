"""The simulator against published GPU measurements: cited figures, errors on fit and held-out sets."""

from __future__ import annotations

import numpy as np
import pytest

from itlbench.sim.hardware import FIT, presets
from itlbench.sim.published import ENGINE_PARAMS, FIGURES, default_params, errors


def _abs(rows: list) -> list[float]:
    return [abs(e) for *_, e in rows]


def _fit_loss(params: dict[str, float]) -> float:
    return float(np.mean(_abs(errors(params, [f for f in FIGURES if f.fit]))))


def test_every_figure_cites_its_public_file_and_the_sets_are_split() -> None:
    keys = [f.key for f in FIGURES]
    assert len(keys) == len(set(keys)) >= 50
    for f in FIGURES:
        assert f.repo in ("microsoft/sarathi-serve", "microsoft/vidur", "NVIDIA/TensorRT-LLM") and f.path
        assert f.measured_s > 0
    fit = {f.key for f in FIGURES if f.fit}
    held = set(keys) - fit
    assert len(fit) >= 20 and len(held) >= 25
    for source in ("sarathi prefill", "sarathi decode", "sarathi chunked", "vidur", "trtllm ttft", "trtllm batch"):
        assert any(k.startswith(source) for k in held), source  # every source has held-out figures
    assert "trtllm ttft llama-2-70b a100 float16 tp4 2048" in held and "vidur qkv 32768 tp2" in held  # TP predicted
    # every static-batch throughput held out but one, the only figure that fixes trtllm_gqa_reread
    assert {k for k in fit if k.startswith("trtllm batch")} == {"trtllm batch llama-2-70b h100 fp8 tp2 64x2048/2048"}
    assert sum(k.startswith("trtllm batch") for k in held) == 18


def test_the_stored_parameters_meet_the_error_targets_in_and_out_of_the_fit() -> None:
    rows = errors(default_params())
    fit, held = [r for r in rows if r[0].fit], [r for r in rows if not r[0].fit]
    for subset in (fit, held):
        assert np.median(_abs(subset)) <= 0.10 and np.mean(_abs(subset)) <= 0.10
    # over 15 %: Sarathi's decode batches of 8 and 16 and 1,024-token chunks; TensorRT-LLM's 128-token TTFTs,
    # L40S and H100 TP4 TTFTs and 70B batches of 2,048-token prompts (docs/perf/sim-vs-published.md)
    assert sum(e > 0.15 for e in _abs(rows)) <= 10
    assert max(_abs(rows)) < 0.40


@pytest.mark.parametrize("name", list(default_params()))
def test_the_stored_parameters_are_the_fit(name: str) -> None:
    """Each stored parameter is at a minimum of the fit-set error: moving it 5 % either way does not help."""
    base = default_params()
    best = _fit_loss(base)
    for factor in (0.95, 1.05):
        moved = base | {name: min(base[name] * factor, 0.999)}
        assert _fit_loss(moved) >= best - 2e-3, (name, factor)


def test_presets_are_built_from_the_fit_and_engines_keep_their_own_overheads() -> None:
    gpus = presets()
    assert gpus["a100"].gemm_eff == FIT["gemm_eff_a100"] and gpus["a100-pcie"].gemm_eff == FIT["gemm_eff_a100_pcie"]
    assert gpus["h100"].fp8_gemm_eff == FIT["fp8_gemm_eff_h100"] and gpus["a100"].fp8_gemm_eff == 0.0
    changed = presets(FIT | {"mem_eff": 0.5})
    assert all(hw.mem_eff == 0.5 for hw in changed.values())
    # Sarathi-Serve's prototype runs eagerly with costs of its own; the presets do not inherit them
    assert ENGINE_PARAMS["sarathi_step_s"] > gpus["h100"].step_overhead_s
