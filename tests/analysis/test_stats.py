"""Percentile helpers: the live progress line and the analysis use numpy's linear method, and a
percentile its samples cannot support is withheld."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from itlbench.analysis.stats import describe, min_samples, supported_quantile
from itlbench.load.progress import ms_percentile


@given(st.lists(st.integers(0, 10**10), min_size=1, max_size=300), st.sampled_from([0, 50, 90, 99, 100]))
def test_live_percentile_is_numpys(values, q):
    assert ms_percentile(values, q) == pytest.approx(float(np.percentile(values, q)) / 1e6)


def test_live_percentile_of_nothing():
    assert ms_percentile([], 50) is None


def test_minimum_samples_per_quantile():
    assert [min_samples(q) for q in (0.5, 0.9, 0.95, 0.99, 0.999)] == [2, 10, 20, 100, 1000]


def test_a_quantile_is_withheld_until_its_samples_support_it():
    nine, ten = pl.Series(range(9), dtype=pl.Float64), pl.Series(range(10), dtype=pl.Float64)
    assert supported_quantile(nine, 0.9) is None
    assert supported_quantile(ten, 0.9) == pytest.approx(np.percentile(range(10), 90))
    d = describe(pl.DataFrame({"x": list(range(99))}, schema={"x": pl.Float64}), "x", ("p90", "p99", "max", "count"))
    assert d == {"p90": pytest.approx(np.percentile(range(99), 90)), "p99": None, "max": 98.0, "count": 99}
    d = describe(pl.DataFrame({"x": list(range(100))}, schema={"x": pl.Float64}), "x", ("p99",))
    assert d == {"p99": pytest.approx(np.percentile(range(100), 99))}  # the count it needed stays out
