"""When failed engine steps mean a dead engine, in both serving layouts (`AsyncEngine`, `EngineCore`).

A failed step fails the requests in its batch and the engine carries on: a transient fault costs one batch.
A fault that persists (a CUDA error that poisons the context, a corrupted K/V pool) fails every step, and
serving on would answer /health with 200 while failing every request. As vLLM's engine does (EngineDeadError),
so many failed steps in a row, no step succeeding in between, declare the engine dead: the server then stops
as it does when its engine process dies, naming the last exception, for a supervisor to restart it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from itlbench.serving.client import EngineDeadError, engine_stopped

if TYPE_CHECKING:
    from itlbench.core.engine import SteppedEngine
    from itlbench.core.request import RequestOutput

MAX_FAILED_STEPS = 3  # in a row; a step that succeeds starts the count again


class EngineDeclaredDead(Exception):
    """Raised out of the step that made too many failed in a row: ends the engine loop with `error`."""

    def __init__(self, error: EngineDeadError) -> None:
        super().__init__(str(error))
        self.error = error


class FailedSteps:
    """Counts the failed steps since the last one that succeeded."""

    def __init__(self, limit: int = MAX_FAILED_STEPS) -> None:
        self.limit = limit
        self.in_a_row = 0

    def succeeded(self) -> None:
        self.in_a_row = 0

    def failed(self, exc: BaseException) -> None:
        """Count a failed step; returns while the engine may still recover (fail the batch, carry on), else
        raises EngineDeclaredDead naming `exc`: the loop stops, failing every request with that error."""
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise EngineDeclaredDead(engine_stopped(exc, f"after {self.in_a_row} failed steps in a row")) from exc

    def step(self, engine: SteppedEngine, prev_end_ns: int | None, log: logging.Logger,
             in_flight: int) -> tuple[list[RequestOutput], Exception | None]:
        """One engine step, the hand-off since the last one's end (`prev_end_ns`; None: not timed) noted first.
        A step that raises is logged with its traceback and counted (`failed`: the last of too many in a row
        raises) and comes back as ([], the exception), for the caller to fail its batch; else (outputs, None)."""
        if prev_end_ns is not None:
            engine.note_handoff(time.perf_counter_ns() - prev_end_ns)
        try:
            outputs = engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving if the engine recovers
            log.exception("engine step failed; failing %d in-flight requests", in_flight)
            self.failed(exc)
            return [], exc
        self.succeeded()
        return outputs, None
