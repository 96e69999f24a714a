"""Pooled statistics of more samples than fit in memory, exact: count, sum, max and percentiles.

Percentiles are selected out of core in two passes over the samples (which the caller can replay,
e.g. from per-partition files), with the method of `stats.PERCENTILE_METHOD`:

  pass 1  every sample falls in a bucket of its float64 bit pattern with the low 40 mantissa bits
          dropped (`bucket_keys`): 4,096 buckets per power of two, ordered exactly like the values
          (IEEE-754 bit patterns of non-negative floats sort as the floats do; negatives are mirrored),
          so a histogram of bucket counts (`Pooled.add`) locates the bucket holding any rank;
  pass 2  only the samples in the buckets that hold the wanted ranks are kept (`Selection.add`),
          reduced at once to distinct values with their counts; sorting those gives the values at
          the ranks, interpolated exactly as polars and numpy interpolate.

Memory is the histogram (~4 MB) plus the distinct values of at most two buckets per percentile (a
bucket spans 0.024 % of its values, so ~0.1 % of a dense distribution's samples at its median), not
the samples. The same histogram also answers any quantile approximately (`approx_quantile`: the
bucket's midpoint, within 0.013 % of the true value), which is what figures use for a CDF.
Samples may carry integer weights (a per-token view counts a gap split in k once per token).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from itlbench.analysis.stats import QUANTILES, withhold_unsupported

DROP_BITS = 40  # mantissa bits dropped: 52 - 40 = 12 kept, 4,096 buckets per octave
LOW_EXPONENT, HIGH_EXPONENT = -40, 24  # 2^-40 s (~1 ps) .. 2^24 s (194 days); beyond: the end buckets
_BASE = (1023 + LOW_EXPONENT) << (52 - DROP_BITS)
SPAN = (HIGH_EXPONENT - LOW_EXPONENT) << (52 - DROP_BITS)  # buckets per sign
RELATIVE_WIDTH = 2.0 ** -(52 - DROP_BITS)  # a bucket spans at most this fraction of its lower edge


def bucket_keys(values: np.ndarray) -> np.ndarray:
    """Bucket of each finite float64: non-decreasing in the value, 0 for zero and tiny values,
    negative for negative values (mirrored), so keys sort exactly as the values do."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    bits = np.abs(v).view(np.int64) >> DROP_BITS
    mag = np.clip(bits - _BASE + 1, 0, SPAN)
    mag[np.abs(v) < 2.0 ** LOW_EXPONENT] = 0
    return np.where(v < 0, -mag, mag)


def bucket_value(key: int) -> float:
    """The midpoint of a bucket (for approximate quantiles; the end buckets answer their inner edge)."""
    mag = abs(key)
    if mag == 0:
        return 0.0
    lo = np.array([(mag - 1 + _BASE) << DROP_BITS], dtype=np.int64).view(np.float64)[0]
    hi = np.array([(mag + _BASE) << DROP_BITS], dtype=np.int64).view(np.float64)[0]
    mid = float(lo) if mag == SPAN else (float(lo) + float(hi)) / 2
    return -mid if key < 0 else mid


@dataclass
class Pooled:
    """Pass 1 of one pooled figure: weighted count, sum, max and the bucket histogram."""

    count: int = 0
    total: float = 0.0
    maximum: float | None = None
    hist: np.ndarray = field(default_factory=lambda: np.zeros(2 * SPAN + 1, dtype=np.int64))

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        values = np.asarray(values, dtype=np.float64)
        if not values.size:
            return
        w = None if weights is None else np.asarray(weights, dtype=np.int64)
        self.count += int(values.size if w is None else w.sum())
        self.total += float(values.sum() if w is None else (values * w).sum())
        top = float(values.max())
        self.maximum = top if self.maximum is None else max(self.maximum, top)
        self.hist += np.bincount(bucket_keys(values) + SPAN, weights=w, minlength=self.hist.size).astype(np.int64)

    def merge(self, other: Pooled) -> None:
        self.count += other.count
        self.total += other.total
        if other.maximum is not None:
            self.maximum = other.maximum if self.maximum is None else max(self.maximum, other.maximum)
        self.hist += other.hist

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def _rank_bucket(self, ranks: Sequence[int], cum: np.ndarray | None = None) -> dict[int, int]:
        """rank → (bucket key) for each 0-based rank (`cum`: the histogram's running count, if summed already)."""
        cum = np.cumsum(self.hist) if cum is None else cum
        idx = np.searchsorted(cum, np.asarray(ranks, dtype=np.int64), side="right")
        return {int(r): int(i) - SPAN for r, i in zip(ranks, idx, strict=True)}

    def approx_quantile(self, q: float) -> float | None:
        """The q-quantile from the histogram alone: the midpoints of the buckets holding its two ranks,
        interpolated (each within RELATIVE_WIDTH / 2 of the value at its rank)."""
        return self.approx_quantiles([q])[0]

    def approx_quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """`approx_quantile` of each q, the histogram's running count summed once: a CDF asks for 400, and
        summing the 4 MB histogram for each was a third of a small run's analysis."""
        if not self.count:
            return [None] * len(qs)
        spans = [(f, math.floor(f), min(math.floor(f) + 1, self.count - 1)) for f in ((self.count - 1) * q for q in qs)]
        where = self._rank_bucket([r for _, lo, hi in spans for r in (lo, hi)])
        out: list[float | None] = []
        for f, lo, hi in spans:
            lower, upper = bucket_value(where[lo]), bucket_value(where[hi])
            out.append(lower + (upper - lower) * (f - lo))
        return out

    def selection(self, qs: Iterable[float]) -> Selection:
        """Pass 2's plan for the quantiles qs: which buckets to keep and which ranks to read."""
        positions = {q: (self.count - 1) * q for q in qs} if self.count else {}
        ranks = sorted({r for f in positions.values() for r in (math.floor(f), min(math.floor(f) + 1,
                                                                                  self.count - 1))})
        cum = np.cumsum(self.hist)  # summed once for both: the histogram is 4 MB
        where = self._rank_bucket(ranks, cum)
        before = {key: int(cum[key + SPAN - 1]) if key + SPAN else 0 for key in set(where.values())}
        return Selection(self.count, positions, where, before)


@dataclass
class Selection:
    """Pass 2: the distinct values (with counts) of the buckets that hold the wanted ranks."""

    count: int
    positions: dict[float, float]
    where: dict[int, int]  # rank → bucket key
    before: dict[int, int]  # bucket key → samples in lower buckets
    found: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        if not self.before or not len(values):
            return
        values = np.asarray(values, dtype=np.float64)
        keys = bucket_keys(values)
        wanted = np.fromiter(self.before, dtype=np.int64)
        mask = np.isin(keys, wanted)
        if not mask.any():
            return
        v, k = values[mask], keys[mask]
        w = np.ones(v.size, dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)[mask]
        for key in np.unique(k).tolist():
            sel = k == key
            distinct, inverse = np.unique(v[sel], return_inverse=True)
            self.found.setdefault(key, []).append((distinct, np.bincount(inverse, weights=w[sel]).astype(np.int64)))

    def _value_at(self, rank: int) -> float:
        key = self.where[rank]
        parts = self.found.get(key) or []
        if not parts:
            raise RuntimeError("pass 2 saw no sample in a bucket pass 1 counted: the samples were not replayed")
        values = np.concatenate([p[0] for p in parts])
        counts = np.concatenate([p[1] for p in parts])
        order = np.argsort(values, kind="stable")
        cum = np.cumsum(counts[order])
        i = int(np.searchsorted(cum, rank - self.before[key], side="right"))
        return float(values[order][i])

    def quantile(self, q: float) -> float | None:
        """The q-quantile, interpolated as polars' `interpolation="linear"` does."""
        if q not in self.positions:
            return None
        f = self.positions[q]
        lo = math.floor(f)
        lower = self._value_at(lo)
        upper = self._value_at(min(lo + 1, self.count - 1))
        return lower + (upper - lower) * (f - lo)


def describe_pooled(pooled: Pooled, quantiles: Mapping[str, float | None],
                    keys: Sequence[str]) -> dict[str, float | int | None]:
    """`stats.describe` of pooled samples (`quantiles`: percentile key → value, from a Selection): the
    same keys, nulls and withheld percentiles."""
    if not pooled.count:
        return {k: (0 if k == "count" else None) for k in keys}
    row: dict[str, float | int | None] = {"count": pooled.count}
    for k in keys:
        if k in QUANTILES:
            row[k] = quantiles.get(k)
        elif k == "max":
            row[k] = pooled.maximum
        elif k == "mean":
            row[k] = pooled.mean()
    row = withhold_unsupported(row)
    return {k: row.get(k) for k in keys}
