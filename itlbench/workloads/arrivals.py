"""Open-loop arrival processes: Poisson, and gamma renewal processes for burstier traffic."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_CHUNK = 1024


def gamma_gaps(rng: np.random.Generator, rate: float, burstiness: float, size: int) -> np.ndarray:
    """Inter-arrival gaps with mean 1/rate and coefficient of variation 1/sqrt(burstiness).

    burstiness 1 is exponential (Poisson); below 1 is burstier, above 1 more regular.
    """
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=size)


def arrival_times(rate: float, duration_s: float, burstiness: float = 1.0,
                  seed: int = 0) -> Iterator[float]:
    """Seeded send times in [0, duration_s), lazily, for an open-loop feed (rate and burstiness as
    checked by `workloads.build.check_load_shape`)."""
    return _times(np.random.default_rng(seed), rate, burstiness, duration_s)


def _times(rng: np.random.Generator, rate: float, burstiness: float,
           duration_s: float) -> Iterator[float]:
    t = 0.0
    while True:
        for gap in gamma_gaps(rng, rate, burstiness, _CHUNK):
            t += float(gap)
            if t >= duration_s:
                return
            yield t
