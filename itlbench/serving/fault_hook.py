"""A test hook, not a user option: make the engine break at a chosen step, to see what a server does when
the loop driving its engine dies (tests/server/test_engine_crash.py).

Set `ITLBENCH_TEST_ENGINE_FAULT=N` in the server's environment: the engine's Nth step in this process raises
`RuntimeError("injected engine fault at step N")`, and so does every step and abort after it, as an engine
whose state a failed step corrupted would. The driver's recovery (abort the batch, keep serving) then fails
too, so its loop stops, as it would on a real fault of that kind. Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import os

from itlbench.core.engine import SteppedEngine
from itlbench.errors import ConfigError

FAULT_ENV = "ITLBENCH_TEST_ENGINE_FAULT"


def inject_engine_fault(engine: SteppedEngine) -> SteppedEngine:
    """The engine, its `step` and `abort` wrapped when FAULT_ENV asks for a fault (else untouched)."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec:
        return engine
    if not spec.isdigit() or int(spec) < 1:
        raise ConfigError(FAULT_ENV, f"must be a step number >= 1, got {spec!r}", f"unset {FAULT_ENV} (a test hook)")
    at = int(spec)
    step, abort = engine.step, engine.abort
    steps = 0

    def fault() -> RuntimeError:
        return RuntimeError(f"injected engine fault at step {at}")

    def faulty_step():  # type: ignore[no-untyped-def]
        nonlocal steps
        steps += 1
        if steps >= at:
            raise fault()
        return step()

    def faulty_abort(request_id: str) -> bool:
        if steps >= at:
            raise fault()
        return abort(request_id)

    engine.step = faulty_step  # type: ignore[method-assign]
    engine.abort = faulty_abort  # type: ignore[method-assign]
    return engine
