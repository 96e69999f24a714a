"""Histogram buckets against what the dashboards compute from them, through Prometheus' own PromQL engine
(`promtool test rules`, no server): the real client and server histograms are filled, their exposition
becomes the input series, and the dashboard panels' expressions are evaluated on it.

- ITL: histogram_quantile over the ITL buckets stays within 10 % of the exact p50, p90 and p99 of a
  realistic GPU ITL distribution (decode steps of 2 to 35 ms, mixed steps, rare prefill stalls).
- Every vLLM bucket of the same latency is a bucket here (the lists written out from vLLM's source).
- Token-budget use: p50 resolves a decode step's sliver of the budget, and the panel's max shows the
  few budget-filling chunk steps among thousands of decode steps (a p99 cannot).
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from itlbench.core.metric_buckets import ITL_BUCKETS, REQUEST_BUCKETS
from itlbench.core.steps import StepRecord
from itlbench.server.metrics import ServerMetrics
from itlbench.telemetry.client_metrics import ClientMetrics
from tests.support.dashboards import dashboards, substitute

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py), written out independently of the module under test.
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0]
VLLM_REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0]  # e2e, queue, inference, prefill and decode time per request

RATE_INTERVAL = "1m"
MAX_ERROR = 0.10


def test_itl_buckets_are_dense_between_1_and_100_ms_and_few() -> None:
    steps = [b / a for a, b in itertools.pairwise(ITL_BUCKETS) if 0.001 <= a < 0.1]
    assert len(steps) >= 35 and max(steps) <= 1.2, "at most 20 % from one bucket to the next in 1-100 ms"
    assert len(ITL_BUCKETS) <= 70 and len(REQUEST_BUCKETS) <= 50, "series count: buckets × label sets"


def test_every_vllm_bucket_of_the_same_latency_is_here() -> None:
    assert set(VLLM_ITL) <= set(ITL_BUCKETS)
    assert set(VLLM_TTFT) | set(VLLM_REQUEST) <= set(REQUEST_BUCKETS)


# ---- PromQL through promtool ---------------------------------------------------------------------
def _series(registry: Any, suffix: str) -> dict[str, float]:
    """Every `*{suffix}` sample of a registry's real exposition, as a PromQL series selector → value."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.endswith(suffix):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _promql_true(tmp_path: Path, series: dict[str, float], checks: dict[str, str]) -> list[str]:
    """Each check is a PromQL `bool` expression over counters that went from 0 to `series` within a
    minute; returns the names of the checks that Prometheus did not evaluate to 1 (all in one promtool
    run, then one by one only to name the failures)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install -y --no-install-recommends prometheus (.ci/run does)"
    inputs = [{"series": sel, "values": f"0 {v:g} {v:g} {v:g} {v:g}"} for sel, v in series.items()]

    def passes(exprs: list[str]) -> bool:
        test = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
            "interval": "15s", "input_series": inputs,
            "promql_expr_test": [{"expr": e, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 1}]}
                                 for e in exprs]}]}
        path = tmp_path / "test.yml"
        path.write_text(yaml.safe_dump(test))
        r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 or "FAILED" in r.stdout + r.stderr, r.stdout + r.stderr  # a broken file is no answer
        return r.returncode == 0

    if passes(list(checks.values())):
        return []
    return [name for name, expr in checks.items() if not passes([expr])]


def _panel(board: str, title_start: str) -> dict[str, str]:
    """legend → expression of a dashboard panel, as Grafana sends it (all models, all workloads)."""
    (panel,) = [p for p in dashboards()[board]["panels"] if p.get("title", "").startswith(title_start)]
    return {t["legendFormat"]: substitute(t["expr"], "itlbench_", RATE_INTERVAL) for t in panel["targets"]}


def histogram_quantile(q: float, bounds: tuple[float, ...], samples: np.ndarray) -> float:
    """Prometheus' interpolation, for the failure message (the checks themselves run in Prometheus)."""
    upper = [*bounds, float("inf")]
    cum = np.searchsorted(np.sort(samples), upper, side="right")
    rank = q * cum[-1]
    i = int(np.searchsorted(cum, rank, side="left"))
    if i == len(upper) - 1:
        return upper[-2]
    lo, below = (0.0, 0) if i == 0 else (upper[i - 1], cum[i - 1])
    return float(lo + (upper[i] - lo) * (rank - below) / (cum[i] - below))


def gpu_itl(step_s: float, n: int = 20_000, seed: int = 7) -> np.ndarray:
    """Gaps a client sees from a GPU engine: decode steps of `step_s` (3 % jitter), 5 % mixed steps that
    carry a prefill chunk (1.15-1.6×), 1 % prefill stalls (2.5-5×), plus the client's receive jitter —
    the shape of `itlbench serve --engine sim --gpu a100` (p50 13.0, p90 14.4, p99 26 ms at 13.3 ms)."""
    rng = np.random.default_rng(seed)
    gap = step_s * rng.normal(1.0, 0.03, n)
    kind = rng.random(n)
    gap = np.where(kind < 0.06, gap * rng.uniform(1.15, 1.6, n), gap)
    gap = np.where(kind < 0.01, step_s * rng.uniform(2.5, 5.0, n), gap)
    return gap + rng.exponential(0.0003, n)


@pytest.mark.parametrize("step_ms", [2.0, 5.0, 13.3, 35.0])
def test_dashboard_itl_percentiles_are_within_10_percent_of_exact(tmp_path: Path, step_ms: float) -> None:
    gaps = gpu_itl(step_ms / 1e3)
    metrics = ClientMetrics()
    child = metrics.itl.labels("chat", "false")
    for g in gaps:
        child.observe(float(g))
    series = _series(metrics.registry, "inter_token_latency_seconds_bucket")
    exprs = _panel("itlbench-load.json", "ITL per gap")
    checks, report = {}, []
    for legend, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = float(np.percentile(gaps, q * 100))
        ours = float(histogram_quantile(q, ITL_BUCKETS, gaps))
        checks[f"{legend} within {MAX_ERROR:.0%}"] = f"abs(({exprs[legend]}) / {exact!r} - 1) <= bool {MAX_ERROR}"
        checks[f"{legend} is Prometheus' own interpolation"] = f"abs(({exprs[legend]}) / {ours!r} - 1) < bool 1e-9"
        report.append(f"{legend}: exact {exact * 1e3:.2f} ms, histogram_quantile {ours * 1e3:.2f} ms "
                      f"({ours / exact - 1:+.1%})")
    failed = _promql_true(tmp_path, series, checks)
    assert not failed, f"{failed} at a {step_ms} ms step; " + "; ".join(report)


def _step(budget: int, prefill: int, decode: int) -> StepRecord:
    return StepRecord(step=0, phase="mixed" if prefill and decode else ("prefill" if prefill else "decode"),
                      prefill_tokens=prefill, decode_tokens=decode, num_prefill_reqs=int(prefill > 0),
                      num_decode_reqs=decode, num_running=decode, num_waiting=0, num_preemptions=0, kv_usage=0.1,
                      token_budget=budget, start_ns=0, end_ns=10_000_000)


def test_budget_panel_shows_the_sliver_and_the_chunks_that_fill_the_budget(tmp_path: Path) -> None:
    """8 streams decoding under a 2048-token budget (8/2048 = 0.39 % a step), 3000 steps, among which
    one 8k prompt goes in as four chunk steps that fill the budget; beside it a model that only decodes."""
    busy, calm = ServerMetrics("busy"), ServerMetrics("calm")
    for i in range(3000):
        busy._observe_step(_step(2048, 2040, 8) if i in (1000, 1001, 1002, 1003) else _step(2048, 0, 8))
        calm._observe_step(_step(2048, 0, 8))
    series = {**_series(busy.registry, "budget_used_ratio_bucket"), **_series(calm.registry, "budget_used_ratio_bucket"),
              **_series(busy.registry, "budget_used_ratio_sum"), **_series(busy.registry, "budget_used_ratio_count")}
    exprs = _panel("itlbench-load.json", "Token-budget use per step")
    assert set(exprs) == {"p50", "max", "mean"}

    def of(legend: str, model: str) -> str:
        return "(" + exprs[legend].replace('model_name=~".*"', f'model_name="{model}"') + ")"

    failed = _promql_true(tmp_path, series, {
        "p50 reads the decode sliver (within 30 % of 0.39 %)": f"abs({of('p50', 'calm')} / (8 / 2048) - 1) <= bool 0.3",
        "max shows the budget-filling chunks": f"{of('max', 'busy')} >= bool 0.99",
        "max without chunks stays at the sliver": f"{of('max', 'calm')} <= bool 0.005",
        "p50 is not moved by four chunk steps": f"abs({of('p50', 'busy')} / {of('p50', 'calm')} - 1) < bool 0.05",
    })
    assert not failed, failed
