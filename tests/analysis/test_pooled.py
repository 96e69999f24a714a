"""Out-of-core pooled percentiles (analysis/pooled.py) are the exact ones, and the histogram's
approximate quantiles (the report's CDF) stay within half a bucket of them."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.analysis.pooled import RELATIVE_WIDTH, SPAN, Pooled, bucket_keys, bucket_value, describe_pooled
from itlbench.analysis.scale import cdf_levels
from itlbench.analysis.stats import QUANTILES, describe

QS = tuple(QUANTILES.values())


def _two_passes(values: np.ndarray, weights: np.ndarray | None, pieces: int) -> tuple[Pooled, dict[float, float]]:
    idx = np.array_split(np.arange(values.size), pieces)
    pooled = Pooled()
    for i in idx:
        pooled.add(values[i], None if weights is None else weights[i])
    sel = pooled.selection(QS)
    for i in idx[::-1]:  # pass 2 in another order: nothing depends on it
        sel.add(values[i], None if weights is None else weights[i])
    return pooled, {q: sel.quantile(q) for q in QS}  # type: ignore[misc]


def _adversarial(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        rng.normal(0.04, 0.002, 50_000),  # a dense body: thousands of samples per bucket
        np.zeros(3_000),  # chunks read together: zero gaps
        np.full(5_000, 0.04),  # one value repeated
        rng.exponential(1.0, 2_000),  # a long tail
        -rng.exponential(1e-3, 30),  # out-of-order stamps
        [1e-15, 5e-13, 2.0 ** 30, 1e9],  # beyond the bucket range on both ends
    ])


@pytest.mark.parametrize("weighted", [False, True])
def test_percentiles_are_exactly_polars_linear(weighted: bool) -> None:
    rng = np.random.default_rng(1)
    x = rng.permutation(_adversarial(rng))
    w = rng.integers(1, 5, x.size) if weighted else None
    pooled, got = _two_passes(x, w, pieces=7)
    ref = pl.Series(np.repeat(x, w) if weighted else x)
    for q in QS:
        assert got[q] == ref.quantile(q, interpolation="linear"), q
    assert pooled.count == ref.len() and pooled.maximum == ref.max()
    assert pooled.mean() == pytest.approx(ref.mean(), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e6, allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=300),
       st.integers(1, 6))
def test_percentiles_exact_on_any_sample(values: list[float], pieces: int) -> None:
    x = np.array(values)
    _, got = _two_passes(x, None, pieces=min(pieces, x.size))
    ref = pl.Series(x)
    for q in QS:
        assert got[q] == ref.quantile(q, interpolation="linear")


def test_buckets_sort_exactly_as_the_values() -> None:
    rng = np.random.default_rng(2)
    x = np.sort(np.concatenate([_adversarial(rng), np.nextafter(0.04, 1.0) + np.arange(50) * 1e-17]))
    keys = bucket_keys(x)
    assert (np.diff(keys) >= 0).all(), "a bucket boundary out of value order"


@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999])
def test_approximate_quantiles_within_half_a_bucket(q: float) -> None:
    """The report's CDF: each point within RELATIVE_WIDTH / 2 (0.012 %) of the exact quantile."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.lognormal(-3.2, 0.3, 200_000), rng.exponential(1.0, 300)])
    pooled = Pooled()
    pooled.add(x)
    exact = float(pl.Series(x).quantile(q, interpolation="linear"))  # type: ignore[arg-type]
    approx = pooled.approx_quantile(q)
    assert approx is not None and abs(approx - exact) <= exact * RELATIVE_WIDTH / 2
    assert RELATIVE_WIDTH / 2 < 1.3e-4


def test_describe_pooled_is_describe() -> None:
    rng = np.random.default_rng(4)
    for n in (0, 1, 5, 50, 500, 5000):
        x = rng.exponential(0.05, n)
        pooled, got = _two_passes(x, None, pieces=max(1, min(3, n)))
        keys = ("p50", "p90", "p95", "p99", "p999", "max", "mean", "count")
        ours = describe_pooled(pooled, {k: got[QUANTILES[k]] for k in QUANTILES} if n else {}, keys)
        ref = describe(pl.DataFrame({"v": x}), "v", keys)
        assert ours.keys() == ref.keys()
        for k in keys:
            assert ours[k] == pytest.approx(ref[k], rel=1e-12) if ref[k] is not None else ours[k] is None, (n, k)



def _one_at_a_time(pooled: Pooled, q: float) -> float:
    """One quantile with its own running count of the histogram, as each CDF level was once computed."""
    f = (pooled.count - 1) * q
    lo, hi = math.floor(f), min(math.floor(f) + 1, pooled.count - 1)
    lower, upper = (bucket_value(int(i) - SPAN) for i in np.searchsorted(np.cumsum(pooled.hist), [lo, hi], side="right"))
    return lower + (upper - lower) * (f - lo)


def test_approx_quantiles_in_one_call_equal_each_computed_alone_to_the_bit() -> None:
    """The CDF's 400 levels, one running count for all, equal each level computed alone exactly, weights too."""
    rng = np.random.default_rng(7)
    levels = [float(q) for q in cdf_levels()] + [0.0, 1.0]
    for n, weighted in ((1, False), (2, True), (1000, False), (5000, True)):
        pooled = Pooled()
        pooled.add(rng.lognormal(-3.5, 1.0, n), rng.integers(1, 4, n) if weighted else None)
        assert pooled.approx_quantiles(levels) == [_one_at_a_time(pooled, q) for q in levels]
        assert pooled.approx_quantile(0.99) == _one_at_a_time(pooled, 0.99)
    assert Pooled().approx_quantiles([0.5, 0.9]) == [None, None] and Pooled().approx_quantile(0.5) is None
