"""Stalls while the run goes: analysis/stalls.py's rule applied to each stream so far, with its cause.

A gap is a stall when gap ≥ max(factor × the median of its request's gaps so far, floor). The cause
is decided once the step log covers the gap (a step that started after the gap ended has arrived,
and the client's pause watchdog has had a moment to report) or `settle_s` after it ended, by the
same rules as the analysis: prefill (prefill steps fill at least half of it), client (client pauses
cover at least half), preemption, engine (one step at least half of it), outside_engine (the engine
kept stepping); "unknown" when there is no step log or no step overlapped it. Everything here runs
on the client's event loop and is torch- and polars-free.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CAUSES = ("prefill", "client", "preemption", "engine", "outside_engine", "unknown")


class RunningMedian:
    """Median of a growing sample in O(log n) per value (two heaps), as polars' median: the mean of
    the two middle values when the count is even."""

    __slots__ = ("_lo", "_hi")

    def __init__(self) -> None:
        self._lo: list[int] = []  # max-heap (negated): the lower half
        self._hi: list[int] = []  # min-heap: the upper half

    def add(self, x: int) -> None:
        if self._lo and x > -self._lo[0]:
            heapq.heappush(self._hi, x)
            if len(self._hi) > len(self._lo):
                heapq.heappush(self._lo, -heapq.heappop(self._hi))
        else:
            heapq.heappush(self._lo, -x)
            if len(self._lo) > len(self._hi) + 1:
                heapq.heappush(self._hi, -heapq.heappop(self._lo))

    def median(self) -> float:
        if len(self._lo) > len(self._hi):
            return float(-self._lo[0])
        return (-self._lo[0] + self._hi[0]) / 2

    def __len__(self) -> int:
        return len(self._lo) + len(self._hi)


@dataclass(frozen=True, slots=True)
class _Step:
    start_ns: int
    end_ns: int
    prefill: bool
    preemptions: int


@dataclass(frozen=True, slots=True)
class Stall:
    lo_ns: int
    hi_ns: int

    @property
    def gap_s(self) -> float:
        return (self.hi_ns - self.lo_ns) / 1e9


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


class StallDetector:
    """Flags stalled gaps and reports each with its cause through `on_stall(cause, gap_s)`.

    `has_steps`: a step log feeds `add_step`; without one the cause is "client" or "unknown".
    """

    def __init__(self, on_stall: Callable[[str, float], None], *, factor: float = 5.0, floor_s: float = 0.05,
                 has_steps: bool = False, settle_s: float = 2.0, pause_grace_s: float = 0.05,
                 horizon_s: float = 120.0) -> None:
        self.on_stall = on_stall
        self.factor = factor
        self.floor_ns = int(floor_s * 1e9)
        self.has_steps = has_steps
        self.settle_ns = int(settle_s * 1e9)
        self.pause_grace_ns = int(pause_grace_s * 1e9)
        self.horizon_ns = int(horizon_s * 1e9)
        self.pending: deque[Stall] = deque()
        self._steps: deque[_Step] = deque()
        self._pauses: deque[tuple[int, int]] = deque()

    def is_stall(self, gaps: RunningMedian, gap_ns: int) -> bool:
        """`gaps` already holds `gap_ns` (the stream's median so far includes the gap, as in the analysis)."""
        return gap_ns >= self.floor_ns and gap_ns >= self.factor * gaps.median()

    def flag(self, lo_ns: int, hi_ns: int) -> None:
        self.pending.append(Stall(lo_ns, hi_ns))

    def add_step(self, start_ns: int, end_ns: int, prefill_tokens: int, preemptions: int = 0) -> None:
        self._steps.append(_Step(start_ns, end_ns, prefill_tokens > 0, preemptions))
        while self._steps and self._steps[0].end_ns < end_ns - self.horizon_ns:
            self._steps.popleft()

    def add_pause(self, start_ns: int, end_ns: int) -> None:
        self._pauses.append((start_ns, end_ns))
        while self._pauses and self._pauses[0][1] < end_ns - self.horizon_ns:
            self._pauses.popleft()

    def settle(self, now_ns: int, final: bool = False) -> None:
        """Decide every pending stall whose evidence is in (or all of them when `final`)."""
        latest_start = self._steps[-1].start_ns if self._steps else None
        while self.pending:
            s = self.pending[0]
            covered = latest_start is not None and latest_start >= s.hi_ns
            ready = final or now_ns >= s.hi_ns + self.settle_ns or (
                (covered or not self.has_steps) and now_ns >= s.hi_ns + self.pause_grace_ns)
            if not ready:
                return  # stalls are flagged in arrival order, so later ones wait too
            self.pending.popleft()
            self.on_stall(self.cause_of(s), s.gap_s)

    def cause_of(self, s: Stall) -> str:
        gap = s.hi_ns - s.lo_ns
        prefill = longest = preemptions = 0
        overlapped = False
        for st in reversed(self._steps):
            if st.start_ns >= s.hi_ns:
                continue
            if st.end_ns <= s.lo_ns:
                break  # steps run one after another: every earlier one ended earlier still
            overlapped = True
            if st.prefill:
                prefill += _overlap(st.start_ns, st.end_ns, s.lo_ns, s.hi_ns)
            longest = max(longest, st.end_ns - st.start_ns)
            preemptions += st.preemptions
        client = sum(_overlap(a, b, s.lo_ns, s.hi_ns) for a, b in self._pauses if b > s.lo_ns and a < s.hi_ns)
        if prefill >= 0.5 * gap:
            return "prefill"
        if client >= 0.5 * gap:
            return "client"
        if not overlapped:
            return "unknown"
        if preemptions:
            return "preemption"
        return "engine" if longest >= 0.5 * gap else "outside_engine"
