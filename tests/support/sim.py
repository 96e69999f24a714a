"""What the simulator's tests share: an engine on a virtual clock run dry over a list of arrivals."""

from __future__ import annotations

from collections.abc import Sequence

from itlbench.core.engine import SteppedEngine
from itlbench.core.request import SamplingParams


def run_offline(engine: SteppedEngine, arrivals: Sequence[tuple[int, Sequence[int], SamplingParams]]) -> dict[str, list[int]]:
    """Feed (arrival ns, prompt, sampling) to an engine on a virtual clock (an `offline_engine` or an
    unpaced `DisaggEngine`) and run it dry; token times (ns) per request id, ids "r0", "r1", ... in
    arrival order."""
    pending = sorted(enumerate(arrivals), key=lambda a: a[1][0])
    times: dict[str, list[int]] = {}
    i = 0
    while i < len(pending) or engine.has_unfinished():
        now = engine.clock.now_ns()
        while i < len(pending) and pending[i][1][0] <= now:
            idx, (t, prompt, sp) = pending[i]
            engine.add_request(prompt, sp, f"r{idx}", t)
            i += 1
        if not engine.has_unfinished():
            engine.clock.advance_to(pending[i][1][0])
            continue
        for out in engine.step():
            if out.new_token_ids:
                times.setdefault(out.request_id, []).append(out.time_ns)
    return times
