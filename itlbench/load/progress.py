"""Live progress: counts and sliding-window latency percentiles, cheap enough to compute twice a second."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProgressSnapshot:
    """One line of live status. Latencies (ms) cover only the most recent gaps and first tokens."""

    elapsed_s: float
    measuring: bool
    sent: int
    done: int
    in_flight: int
    errors: int
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    ttft_p50_ms: float | None
    cpu_percent: float
    loop_lag_ms: float
    waiting_for: str | None = None  # the stream whose first token the adaptive warm-up still waits for
    virtual: bool = False  # elapsed_s is simulated time (sim.virtual_drive): no client, so no latencies or CPU

    def line(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        phase = "measure" if self.measuring else "warmup"
        if self.waiting_for is not None and not self.measuring:
            phase += f" (waiting for {self.waiting_for}'s first token)"
        return (f"{self.elapsed_s:6.1f}s {phase} sent {self.sent} done {self.done} in-flight {self.in_flight} "
                f"err {self.errors} | ITL p50 {ms(self.itl_p50_ms)} p99 {ms(self.itl_p99_ms)} ms "
                f"TTFT p50 {ms(self.ttft_p50_ms)} ms | client CPU {self.cpu_percent:.0f}% "
                f"lag {self.loop_lag_ms:.1f} ms")


def ms_percentile(values_ns: Collection[int], q: float) -> float | None:
    """The q-th percentile (0..100) in ms, numpy's linear method as in the analysis; None when empty."""
    if not values_ns:
        return None
    return float(np.percentile(np.fromiter(values_ns, np.int64, len(values_ns)), q)) / 1e6
