"""The noise rule on repeated runs: intervals from the bootstrap, and 'significant' only beyond the noise."""

from __future__ import annotations

import numpy as np
import pytest

from itlbench.report.compare_ci import bootstrap_ci, judge


def test_the_interval_brackets_the_mean_and_shrinks_with_more_runs() -> None:
    rng = np.random.default_rng(1)
    few = bootstrap_ci(list(rng.normal(10, 1, 5)))
    many = bootstrap_ci(list(rng.normal(10, 1, 200)))
    assert few is not None and many is not None
    assert few.lo < few.mean < few.hi and many.lo < 10 < many.hi
    assert many.hi - many.lo < few.hi - few.lo
    # 200 normal runs: the percentile interval is about mean ± 1.96 σ/√n
    assert many.hi - many.lo == pytest.approx(2 * 1.96 / np.sqrt(200), rel=0.15)
    assert bootstrap_ci([]) is None
    one = bootstrap_ci([3.0])
    assert one is not None and (one.lo, one.hi, one.n) == (3.0, 3.0, 1)
    assert bootstrap_ci([1.0, 2.0, 3.0]) == bootstrap_ci([1.0, 2.0, 3.0]), "seeded: a report is reproducible"


def test_identical_settings_are_within_noise_and_a_tenfold_difference_is_not() -> None:
    """The rule's claims, simulated: three runs each, normal noise of 10 % of the mean."""
    rng = np.random.default_rng(7)
    flagged = 0
    trials = 400
    for _ in range(trials):
        a, b = (bootstrap_ci(list(rng.normal(1.0, 0.1, 3)), resamples=2000) for _ in range(2))
        assert a is not None and b is not None
        flagged += judge(a, b)[0]
    assert flagged / trials < 0.02
    for _ in range(50):
        a = bootstrap_ci(list(rng.normal(1.0, 0.1, 3)), resamples=2000)
        b = bootstrap_ci(list(rng.normal(10.0, 1.0, 3)), resamples=2000)
        assert a is not None and b is not None
        assert judge(a, b)[0]


def test_two_runs_never_make_a_verdict() -> None:
    a, b = bootstrap_ci([1.0, 1.01]), bootstrap_ci([10.0, 10.1])
    assert a is not None and b is not None
    ok, why = judge(a, b)
    assert not ok and "too few runs" in why
