"""Live telemetry's memory stays flat over a long run: nothing it keeps grows with the run's length
(per-request state goes with its request, the step and pause logs keep a fixed horizon, pending stalls
are settled, the ITL window keeps its seconds, histogram children are one per label set)."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itlbench.telemetry.client_metrics import ClientMetrics
from itlbench.telemetry.observer import LiveTelemetry

MS = 1_000_000
S = 1_000_000_000
MINUTES = 15  # of simulated time (traced, each chunk costs tens of microseconds of real time)


@dataclass
class _Plan:
    workload: str
    injected: bool
    prompt_tokens: int


@dataclass
class _Exchange:
    """A test peer standing in for the driver's in-flight request (the fields the observer reads)."""

    plan: _Plan
    scheduled_ns: int
    times: list[int] = field(default_factory=list)
    watch: Any = None
    status: str = "ok"


def _drive(tel: LiveTelemetry, minutes: float, streams: int, rng: np.random.Generator,
           marks: list[float]) -> list[int]:
    """Simulated run clock: a decode step every 60 ms gives each stream a token; every 30 s a 1 s prefill
    stalls them all; a client pause now and then; a client sample each second. Returns traced memory
    at each mark (fraction of the run)."""
    t, end = 0, int(minutes * 60 * S)
    live: dict[int, _Exchange] = {}
    left: dict[int, int] = {}
    memory: list[int] = []
    next_mark, next_sample, next_inject = 0, S, 30 * S
    step = 0
    steps = tel.tee(_Sink())
    while t < end:
        dur = S if t >= next_inject else 60 * MS
        if t >= next_inject:
            next_inject += 30 * S
        steps.add("steps", {"start_ns": t, "end_ns": t + dur, "prefill_tokens": 4096 if dur == S else 0,
                            "num_preemptions": 0})
        t += dur
        step += 1
        jitter = rng.integers(0, MS, streams).tolist()  # one draw a step, not a stream: traced, numpy calls cost
        for s in range(streams):
            ex = live.get(s)
            if ex is None:
                ex = live[s] = _Exchange(_Plan("chat", s == 0, int(rng.integers(100, 9000))), t - 50 * MS)
                tel.on_start(ex)
                left[s] = int(rng.integers(20, 300))
            ex.times.append(t + jitter[s])
            tel.on_chunk(ex, ex.times[-1], 1)
            left[s] -= 1
            if not left[s]:
                tel.on_end(ex, t + MS)
                del live[s]
        if step % 97 == 0:
            tel.on_pause({"start_ns": t - 20 * MS, "end_ns": t})
        if t >= next_sample:
            tel.on_sample({"t_ns": t, "loop_lag_s": 0.0005, "cpu_percent": 20.0})
            next_sample += S
        if next_mark < len(marks) and t >= marks[next_mark] * end:
            gc.collect()
            memory.append(tracemalloc.get_traced_memory()[0])
            next_mark += 1
    return memory


class _Sink:
    def add(self, table: str, row: dict[str, Any]) -> None:
        return None


def test_live_telemetry_memory_is_flat_over_a_long_run() -> None:
    tel = LiveTelemetry(ClientMetrics())
    stalls: list[str] = []
    tel._on_stall = lambda cause, gap_s: stalls.append(cause)  # type: ignore[method-assign]
    tel.stalls.on_stall = tel._on_stall  # type: ignore[union-attr]
    tel.stalls.has_steps = True  # type: ignore[union-attr]
    gc.freeze()  # what the process holds already (torch, the other tests' modules) is not rescanned at each collection
    tracemalloc.start()
    try:
        memory = _drive(tel, minutes=MINUTES, streams=12, rng=np.random.default_rng(0), marks=[0.2, 0.6, 1.0])
    finally:
        tracemalloc.stop()
        gc.unfreeze()
    tel.close()
    # an injection every 30 s: 2 a minute, each stalling the 12 streams
    assert len(stalls) > 12 * (2 * MINUTES - 4) and stalls.count("prefill") > 12 * (2 * MINUTES - 4), \
        "the run stalls at every injection"
    early, middle, late = memory
    # 15 minutes at 12 streams: ~180k chunks, ~144k of them from 20 % (3 min, past the 2-minute horizons) to 100 %;
    # a structure growing by even 8 bytes a chunk adds ~1.1 MiB (a list kept one more pointer a chunk: 1,127 KiB,
    # late - middle 513 KiB; without one the growth stayed within ±40 KiB)
    assert late - early < 256 * 1024, f"telemetry grew by {(late - early) / 1024:.0f} KiB from 20 % to 100 %"
    assert abs(late - middle) < 256 * 1024
    assert len(tel.stalls._steps) <= 121 * S // (60 * MS) + 1  # type: ignore[union-attr]
    assert len(tel.stalls._pauses) <= 121 * S // (97 * 60 * MS) + 1  # type: ignore[union-attr]  # one each 97 steps
    assert len(tel.metrics.itl_max._maxima) <= 11  # type: ignore[union-attr]  # a maximum a second for 10 s
    assert not tel.stalls.pending  # type: ignore[union-attr]
