"""The client watching itself: event-loop lag, process CPU and in-flight count, sampled periodically.

A run is only trustworthy when the client kept up; these samples (table `client_samples`) let the
analysis flag runs where the client, not the server, was the bottleneck.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

import psutil

from itlbench.load.progress import percentile


@dataclass
class ClientStats:
    """Summary of the client's own behaviour over a run (lags in seconds)."""

    samples: int = 0
    cpu_percent_mean: float = 0.0
    cpu_percent_max: float = 0.0
    cpu_seconds: float = 0.0
    loop_lag_p99_s: float = 0.0
    loop_lag_max_s: float = 0.0
    send_lag_p50_s: float | None = None
    send_lag_p99_s: float | None = None
    send_lag_max_s: float | None = None
    dropped_rows: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ClientMonitor:
    """Samples lag (a sleep's actual minus intended wakeup), CPU % of this process and in-flight."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.proc = psutil.Process()
        self.lags: list[float] = []
        self.cpus: list[float] = []
        self._cpu0 = self._cpu_time()
        self.proc.cpu_percent(None)

    def _cpu_time(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    async def tick(self) -> tuple[int, float, float]:
        """Sleep one interval; return (t_ns, loop lag s, cpu %)."""
        intended = time.perf_counter() + self.interval_s
        await asyncio.sleep(self.interval_s)
        lag = max(0.0, time.perf_counter() - intended)
        cpu = self.proc.cpu_percent(None)
        self.lags.append(lag)
        self.cpus.append(cpu)
        return time.perf_counter_ns(), lag, cpu

    def stats(self, send_lags_ns: list[int]) -> ClientStats:
        s = ClientStats(samples=len(self.lags), cpu_seconds=self._cpu_time() - self._cpu0)
        if self.cpus:
            s.cpu_percent_mean = sum(self.cpus) / len(self.cpus)
            s.cpu_percent_max = max(self.cpus)
            s.loop_lag_p99_s = percentile(self.lags, 99) or 0.0
            s.loop_lag_max_s = max(self.lags)
        if send_lags_ns:
            s.send_lag_p50_s = (percentile(send_lags_ns, 50) or 0) / 1e9
            s.send_lag_p99_s = (percentile(send_lags_ns, 99) or 0) / 1e9
            s.send_lag_max_s = max(send_lags_ns) / 1e9
        return s
