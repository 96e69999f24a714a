"""Prefill:decode split of engine time.

From the engine step log (steps overlapping the window, whole durations): prefill-only and
decode-only steps count whole, idle steps not at all, and a mixed step's duration is apportioned
prefill : decode = b·P : c·D, where duration ≈ a + b·P + c·D (P, D = the step's prefill and decode
tokens) is fitted by non-negative least squares on all of this run's non-idle steps, pure and
mixed alike (source "engine_steps:cost_model"): under a token-budget scheduler pure prefill steps
are rare, and mixed steps pin down b and c as well. When that fit is impossible (the steps do not
determine a, b, c, or b = c = 0) mixed steps are split by token share P : D
("engine_steps:token_share").
With no mixed step nothing is apportioned ("engine_steps").
Without steps, an external engine's counters over the window (increase between the two reads nearest
the window's edges, resets handled; `counters_read` gives how far those reads lie from the edges):
  vLLM   vllm:request_prefill_time_seconds_sum / vllm:request_decode_time_seconds_sum
         (per-request phase times summed over requests, so concurrent requests add up)
  SGLang sglang:gpu_execution_seconds_total{category}: categories naming extend/prefill vs decode
  llama.cpp llamacpp:prompt_seconds_total / llamacpp:tokens_predicted_seconds_total (`--metrics`;
         per-request prompt and generation times, added when a request ends, so concurrent slots add up)
Otherwise the source is "unavailable".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s
from itlbench.analysis.window import RunWindow

VLLM_PREFILL = "vllm:request_prefill_time_seconds_sum"
VLLM_DECODE = "vllm:request_decode_time_seconds_sum"
SGLANG_GPU = ("sglang:gpu_execution_seconds_total", "sglang:gpu_execution_seconds")
LLAMACPP_PREFILL = "llamacpp:prompt_seconds_total"
LLAMACPP_DECODE = "llamacpp:tokens_predicted_seconds_total"


@dataclass(frozen=True)
class CostModel:
    """Step seconds ≈ a + b·prefill_tokens + c·decode_tokens (all ≥ 0)."""

    a: float
    b: float
    c: float


def _nnls_small(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Exact non-negative least squares for a handful of columns: best feasible active set."""
    best: tuple[float, np.ndarray] | None = None
    cols = range(x.shape[1])
    for k in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(cols, k):
            coef, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(x.shape[1])
            full[list(subset)] = coef
            resid = float(np.sum((x @ full - y) ** 2))
            if best is None or resid < best[0] - 1e-18:
                best = (resid, full)
    return None if best is None else best[1]


def fit_cost_model(steps: pl.DataFrame) -> CostModel | None:
    """Fit on every non-idle step; None when they cannot determine the model."""
    pure = _with_duration(steps).filter((pl.col("prefill_tokens") > 0) | (pl.col("decode_tokens") > 0))
    if pure.height < 3:
        return None
    p = pure["prefill_tokens"].to_numpy().astype(float)
    d = pure["decode_tokens"].to_numpy().astype(float)
    x = np.column_stack([np.ones_like(p), p, d])
    if np.linalg.matrix_rank(x) < 3:
        return None
    coef = _nnls_small(x, pure["duration_s"].to_numpy().astype(float))
    if coef is None or (coef[1] <= 0 and coef[2] <= 0):
        return None
    return CostModel(float(coef[0]), float(coef[1]), float(coef[2]))


def _with_duration(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.drop_nulls(["start_ns", "end_ns"]).with_columns(
        pl.col("prefill_tokens").fill_null(0),
        pl.col("decode_tokens").fill_null(0),
        ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("duration_s"),
    )


def _prefill_share(model: CostModel | None) -> pl.Expr:
    p, d = pl.col("prefill_tokens").cast(pl.Float64), pl.col("decode_tokens").cast(pl.Float64)
    if model is None:
        return p / (p + d)
    pc, dc = p * model.b, d * model.c
    return pl.when(pc + dc > 0).then(pc / (pc + dc)).otherwise(p / (p + d))


def split_from_steps(steps: pl.DataFrame) -> dict[str, object]:
    s = _with_duration(steps).filter((pl.col("prefill_tokens") > 0) | (pl.col("decode_tokens") > 0))
    mixed = s.filter((pl.col("prefill_tokens") > 0) & (pl.col("decode_tokens") > 0)).height
    model = fit_cost_model(s) if mixed else None
    share = pl.when(pl.col("decode_tokens") == 0).then(1.0).when(pl.col("prefill_tokens") == 0).then(0.0)
    share = share.otherwise(_prefill_share(model))
    totals = s.select(
        (pl.col("duration_s") * share).sum().alias("prefill_s"),
        (pl.col("duration_s") * (1.0 - share)).sum().alias("decode_s"),
    ).row(0, named=True)
    source = (
        "engine_steps" if not mixed else ("engine_steps:cost_model" if model else "engine_steps:token_share")
    )
    out = _result(float(totals["prefill_s"] or 0.0), float(totals["decode_s"] or 0.0), source)
    out["mixed_steps"] = mixed
    out["cost_model"] = (
        None
        if model is None
        else {"a_s": model.a, "b_s_per_prefill_token": model.b, "c_s_per_decode_token": model.c}
    )
    return out


def counter_span(samples: pl.DataFrame, window: RunWindow) -> tuple[int, int] | None:
    """The scrape times (t_ns) nearest the window's start and end: the two reads the counters'
    increase is taken between. By default they are the baseline scrape, which ends just before the
    window opens, and the final one, which starts as sending stops. None without two distinct reads."""
    times = samples["t_ns"].unique().sort()
    if times.len() < 2:
        return None
    t = times.to_numpy()
    first = int(t[np.argmin(np.abs(t - window.measure_start_ns))])
    last = int(t[np.argmin(np.abs(t - window.end_ns))])
    return (first, last) if last > first else None


def counter_increase(samples: pl.DataFrame, window: RunWindow) -> pl.DataFrame:
    """Per series (name, labels): the counter's increase between the reads `counter_span` picks
    (two are enough); a drop between consecutive reads counts as a reset."""
    span = counter_span(samples, window)
    if span is None:
        return pl.DataFrame(schema={"name": pl.Utf8, "labels": pl.Utf8, "increase": pl.Float64})
    s = samples.filter(pl.col("t_ns").is_between(*span)).sort("t_ns")
    diff = pl.col("value").diff().over("name", "labels")
    return (
        s.with_columns(pl.when(diff < 0).then(pl.col("value")).otherwise(diff).alias("inc"))
        .group_by("name", "labels")
        .agg(pl.col("inc").sum().alias("increase"))
    )


def _result(prefill_s: float, decode_s: float, source: str) -> dict[str, object]:
    total = prefill_s + decode_s
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill_frac": prefill_s / total if total > 0 else None,
        "source": source,
    }


def split_from_metrics(server_metrics: pl.DataFrame, window: RunWindow) -> dict[str, object] | None:
    found = _split_from_counters(server_metrics, window)
    span = counter_span(server_metrics, window)
    if found is not None and span is not None:
        found["counters_read"] = {"start_offset_s": (span[0] - window.measure_start_ns) / 1e9,
                                  "end_offset_s": (span[1] - window.end_ns) / 1e9}
    return found


def _split_from_counters(server_metrics: pl.DataFrame, window: RunWindow) -> dict[str, object] | None:
    inc = counter_increase(server_metrics, window)
    for engine, prefill, decode in (("vllm", VLLM_PREFILL, VLLM_DECODE),
                                    ("llamacpp", LLAMACPP_PREFILL, LLAMACPP_DECODE)):
        if inc.filter(pl.col("name").is_in([prefill, decode])).height:
            p = inc.filter(pl.col("name") == prefill)["increase"].sum()
            d = inc.filter(pl.col("name") == decode)["increase"].sum()
            return _result(float(p), float(d), f"server_metrics:{engine} ({prefill}, {decode})")
    gpu = inc.filter(pl.col("name").is_in(SGLANG_GPU)).with_columns(
        pl.col("labels").str.json_path_match("$.category").fill_null("").alias("category")
    )
    if gpu.height:
        is_p = pl.col("category").str.contains("extend|prefill")
        is_d = pl.col("category").str.contains("decode") & ~is_p
        p = gpu.filter(is_p)["increase"].sum()
        d = gpu.filter(is_d)["increase"].sum()
        out = _result(
            float(p), float(d), "server_metrics:sglang (sglang:gpu_execution_seconds_total{category})"
        )
        out["unattributed_s"] = float(gpu.filter(~is_p & ~is_d)["increase"].sum())
        return out
    return None


def time_split(steps: pl.DataFrame, server_metrics: pl.DataFrame, window: RunWindow) -> dict[str, object]:
    """The best available split: engine steps, else server counters, else "unavailable"."""
    if _with_duration(steps).filter((pl.col("prefill_tokens") > 0) | (pl.col("decode_tokens") > 0)).height:
        return json_safe(split_from_steps(steps))  # type: ignore[return-value]
    found = split_from_metrics(server_metrics, window)
    if found is not None:
        return json_safe(found)  # type: ignore[return-value]
    return {"prefill_s": None, "decode_s": None, "prefill_frac": None, "source": "unavailable"}
