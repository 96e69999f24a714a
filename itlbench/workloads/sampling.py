"""Length sampling: lognormal draws whose mean (not median) equals the catalog target."""

from __future__ import annotations

import math

import numpy as np


def lognormal_mu(mean: float, sigma: float) -> float:
    """The log-space location that makes the lognormal's mean equal `mean`."""
    return math.log(mean) - sigma * sigma / 2.0


def sample_lengths(rng: np.random.Generator, mean: float, sigma: float, size: int,
                   low: int = 1, high: int | None = None) -> np.ndarray:
    """`size` integer lengths, lognormal around `mean`, rounded and clipped to [low, high]."""
    if sigma <= 0:
        draws = np.full(size, float(mean))
    else:
        draws = rng.lognormal(lognormal_mu(mean, sigma), sigma, size)
    lengths = np.rint(draws).astype(np.int64)
    return np.clip(lengths, low, high if high is not None else np.iinfo(np.int64).max)


def sample_length(rng: np.random.Generator, mean: float, sigma: float,
                  low: int = 1, high: int | None = None) -> int:
    """One length; see `sample_lengths`."""
    return int(sample_lengths(rng, mean, sigma, 1, low, high)[0])
