"""Prefill:decode split: pure steps, mixed steps by token share and by the fitted cost model,
and external engines' counters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from itlbench.analysis.split import fit_cost_model, split_from_metrics, split_from_steps, time_split
from itlbench.analysis.window import RunWindow
from itlbench.rundir.schema import frame

MS = 1_000_000
WINDOW = RunWindow(0, 1000 * MS, 2000 * MS)


def _steps(specs):
    """specs: (duration_ms, prefill_tokens, decode_tokens), laid end to end from t = 0."""
    rows, t = [], 0.0
    for i, (dur, p, d) in enumerate(specs):
        rows.append(
            {
                "step": i,
                "prefill_tokens": p,
                "decode_tokens": d,
                "start_ns": round(t * MS),
                "end_ns": round((t + dur) * MS),
                "prefill_request_ids": [],
            }
        )
        t += dur
    return frame("steps", rows)


def test_pure_steps_count_whole_and_idle_is_ignored():
    out = split_from_steps(_steps([(100, 1000, 0), (20, 0, 10), (30, 0, 10), (50, 0, 0)]))
    assert out["source"] == "engine_steps"
    assert out["prefill_s"] == pytest.approx(0.100)
    assert out["decode_s"] == pytest.approx(0.050)
    assert out["prefill_frac"] == pytest.approx(0.1 / 0.15)
    assert out["mixed_steps"] == 0


def test_mixed_step_token_share_when_fit_impossible():
    # two steps cannot determine a, b and c
    out = split_from_steps(_steps([(100, 1000, 0), (40, 300, 100)]))
    assert out["source"] == "engine_steps:token_share"
    assert out["cost_model"] is None
    assert out["prefill_s"] == pytest.approx(0.100 + 0.040 * 300 / 400)
    assert out["decode_s"] == pytest.approx(0.040 * 100 / 400)


def test_mixed_step_cost_model():
    # pure steps follow 5 ms + 0.1 ms/prefill token + 1 ms/decode token exactly
    pure = [(15, 100, 0), (55, 500, 0), (15, 0, 10), (25, 0, 20)]
    model = fit_cost_model(_steps(pure))
    assert (model.a, model.b, model.c) == pytest.approx((0.005, 1e-4, 1e-3), rel=1e-6)
    # mixed step 200 prefill + 20 decode on the same model (5 + 20 + 20 ms): b·P = c·D = 20 ms,
    # so its 45 ms split 22.5 : 22.5; being consistent, it leaves the fit unchanged
    out = split_from_steps(_steps([*pure, (45, 200, 20)]))
    assert out["source"] == "engine_steps:cost_model"
    assert out["prefill_s"] == pytest.approx(0.015 + 0.055 + 0.0225)
    assert out["decode_s"] == pytest.approx(0.015 + 0.025 + 0.0225)
    assert out["cost_model"]["c_s_per_decode_token"] == pytest.approx(1e-3, rel=1e-6)


def test_cost_model_is_fitted_on_mixed_steps_too():
    # a token-budget run has no pure prefill step; mixed steps still determine b
    steps = [(15, 0, 10), (25, 0, 20), (5 + 10 + 10, 100, 10), (5 + 50 + 5, 500, 5)]
    out = split_from_steps(_steps(steps))
    assert out["source"] == "engine_steps:cost_model"
    assert out["cost_model"]["b_s_per_prefill_token"] == pytest.approx(1e-4, rel=1e-6)
    assert out["prefill_s"] == pytest.approx(0.025 * 10 / 20 + 0.060 * 50 / 55)


def test_cost_model_coefficients_are_non_negative():
    # decode steps get *faster* with more tokens, so the unconstrained fit has c < 0
    specs = [(10, 100, 0), (20, 200, 0), (30, 300, 0), (40, 0, 10), (5, 0, 100)]
    x = np.array([[1.0, p, d] for _, p, d in specs])
    y = np.array([dur / 1000 for dur, _, _ in specs])
    assert np.linalg.lstsq(x, y, rcond=None)[0].min() < 0
    model = fit_cost_model(_steps(specs))
    coef = np.array([model.a, model.b, model.c])
    assert coef.min() >= 0 and model.c == 0.0
    # KKT: zero gradient on free coefficients, non-negative gradient on those held at 0
    grad = x.T @ (x @ coef - y)
    assert np.allclose(grad[coef > 0], 0, atol=1e-9) and np.all(grad[coef == 0] >= -1e-9)


def _metric(t_ms, name, value, labels="{}"):
    return {"t_ns": t_ms * MS, "name": name, "labels": labels, "value": value}


def test_vllm_counters_delta_over_window_with_reset():
    p, d = "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum"
    metrics = frame(
        "server_metrics",
        [
            _metric(500, p, 10.0),
            _metric(900, p, 12.0),
            _metric(1500, p, 14.0),
            _metric(1900, p, 15.0),
            _metric(2500, p, 99.0),  # after the window
            _metric(1100, d, 1.0),
            _metric(1500, d, 4.0),
            _metric(1700, d, 2.0),  # reset: +2 after it
        ],
    )
    out = split_from_metrics(metrics, WINDOW)
    assert out["prefill_s"] == pytest.approx(3.0)  # 15 − 12 (baseline: last sample before the window)
    assert out["decode_s"] == pytest.approx(5.0)  # 4 − 1, then reset to 2
    assert out["source"].startswith("server_metrics:vllm")
    assert out["prefill_frac"] == pytest.approx(3 / 8)


def test_sglang_gpu_execution_by_category():
    name = "sglang:gpu_execution_seconds_total"
    rows = []
    for cat, v0, v1 in [
        ("forward_extend", 1.0, 4.0),
        ("forward_decode", 2.0, 8.0),
        ("forward_idle", 0.0, 1.0),
    ]:
        labels = json.dumps({"model_name": "m", "category": cat})
        rows += [_metric(900, name, v0, labels), _metric(1900, name, v1, labels)]
    out = time_split(frame("steps", []), frame("server_metrics", rows), WINDOW)
    assert (out["prefill_s"], out["decode_s"]) == pytest.approx((3.0, 6.0))
    assert out["unattributed_s"] == pytest.approx(1.0)
    assert out["source"].startswith("server_metrics:sglang")


def test_unavailable_without_steps_or_known_counters():
    metrics = frame("server_metrics", [_metric(1100, "other_total", 1.0)])
    out = time_split(frame("steps", []), metrics, WINDOW)
    assert out == {"prefill_s": None, "decode_s": None, "prefill_frac": None, "source": "unavailable"}


def test_llamacpp_counters_split_prompt_and_generation_time():
    p, d = "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"
    metrics = frame("server_metrics", [_metric(900, p, 1.0), _metric(1900, p, 3.5), _metric(900, d, 10.0),
                                       _metric(1900, d, 17.5)])
    out = time_split(frame("steps", []), metrics, WINDOW)
    assert (out["prefill_s"], out["decode_s"]) == pytest.approx((2.5, 7.5))
    assert out["source"].startswith("server_metrics:llamacpp")
