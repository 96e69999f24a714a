"""The host's wall clock (CLOCK_REALTIME) to the run's clock, through the offsets the client sampled.

Why: a server's request spans (vLLM's OpenTelemetry) and its log lines (SGLang) carry wall-clock
times; the run's records carry the run's monotonic clock. The two drift apart: NTP slews the wall
clock, and a VM's wall clock can gain 0.6 % on its monotonic one (docs/measures.md). One offset for
the whole run misplaces a span by the drift since that offset was taken: 0.2 s at the end of a 60 s
run at 0.6 %, 20 s after an hour, far past the one-second window spans are matched in. The client
samples the offset every half second (`client_samples.clock_offset_ns`), so each time is mapped
through the offset sampled at its moment, interpolated between samples (held at the ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True)
class WallClockMap:
    run_ns: np.ndarray  # sample times on the run's clock, ascending (float64: exact to the ns below 2**53)
    offset_ns: np.ndarray  # wall − run at each sample, less `base_ns` (small, so float64 keeps every ns)
    base_ns: int  # the median offset

    @classmethod
    def fixed(cls, offset_ns: int) -> WallClockMap:
        return cls(np.zeros(1), np.zeros(1), int(offset_ns))

    @classmethod
    def of(cls, tables: Mapping[str, pl.DataFrame]) -> WallClockMap:
        """From client_samples (t_ns, clock_offset_ns); offset 0 where the run recorded none."""
        samples = tables.get("client_samples")
        if samples is None or not {"t_ns", "clock_offset_ns"} <= set(samples.columns):
            return cls.fixed(0)
        s = samples.select("t_ns", "clock_offset_ns").drop_nulls().sort("t_ns").unique("t_ns", keep="first",
                                                                                      maintain_order=True)
        if s.is_empty():
            return cls.fixed(0)
        offsets = s["clock_offset_ns"].to_numpy().astype(np.int64)
        base = int(np.median(offsets))
        return cls(s["t_ns"].to_numpy().astype(np.float64), (offsets - base).astype(np.float64), base)

    @property
    def drift_ns(self) -> int:
        """How far the offset moved over the run (largest − smallest sample)."""
        return int(self.offset_ns.max() - self.offset_ns.min())

    def _offset(self, run_ns: np.ndarray) -> np.ndarray:
        return np.rint(np.interp(run_ns, self.run_ns, self.offset_ns)).astype(np.int64) + self.base_ns

    def to_run_array(self, wall_ns: np.ndarray) -> np.ndarray:
        wall = np.asarray(wall_ns, dtype=np.int64)
        run = wall - self.base_ns
        for _ in range(6):  # each step shrinks the error by the drift rate (0.6 % at worst seen): ns in 4-5
            nxt = wall - self._offset(run.astype(np.float64))
            if np.array_equal(nxt, run):
                break
            run = nxt
        return run

    def to_run(self, wall_ns: int) -> int:
        return int(self.to_run_array(np.array([wall_ns]))[0])

    def to_wall(self, run_ns: int) -> int:
        return int(run_ns + self._offset(np.array([float(run_ns)]))[0])

    def with_run_column(self, frame: pl.DataFrame, column: str, alias: str) -> pl.DataFrame:
        """`frame` with `alias`: its wall-clock `column` on the run's clock (nulls stay null)."""
        mapped = pl.Series(alias, self.to_run_array(frame[column].fill_null(0).to_numpy()), dtype=pl.Int64)
        return frame.with_columns(mapped).with_columns(
            pl.when(pl.col(column).is_null()).then(None).otherwise(pl.col(alias)).alias(alias))
