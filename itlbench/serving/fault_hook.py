"""A test hook, not a user option: make the engine break at chosen steps, to see what a server does when
its engine fails (tests/server/test_engine_crash.py, tests/server/test_failed_steps.py).

`ITLBENCH_TEST_ENGINE_FAULT` in the server's environment (the engine process inherits it) counts the engine's
steps in this process; a failing step raises `RuntimeError("injected engine fault at step K")`:

- `N`: step N and every step and abort after it, as an engine whose state a failed step corrupted: the
  driver's recovery (abort the batch, keep serving) fails too, so its loop dies at once.
- `N:every`: step N and every step after it, aborts working: a persistent fault (a poisoned CUDA context)
  that fails each batch, until failed steps in a row declare the engine dead.
- `N,M,...:once`: those steps only: transient faults, each failing its batch alone.

Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from itlbench.core.engine import SteppedEngine
from itlbench.errors import ConfigError

FAULT_ENV = "ITLBENCH_TEST_ENGINE_FAULT"
_FORMS = "N, N:every or N,M,...:once (step numbers >= 1)"


def inject_engine_fault(engine: SteppedEngine) -> SteppedEngine:
    """The engine, its `step` (and `abort`) wrapped when FAULT_ENV asks for a fault (else untouched)."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec:
        return engine
    steps_fail, aborts_fail = _parse(spec)
    step, abort = engine.step, engine.abort
    steps = 0

    def faulty_step():  # type: ignore[no-untyped-def]
        nonlocal steps
        steps += 1
        if steps_fail(steps):
            raise RuntimeError(f"injected engine fault at step {steps}")
        return step()

    def faulty_abort(request_id: str) -> bool:
        if aborts_fail(steps):
            raise RuntimeError(f"injected engine fault at step {steps}")
        return abort(request_id)

    engine.step = faulty_step  # type: ignore[method-assign]
    engine.abort = faulty_abort  # type: ignore[method-assign]
    return engine


def _parse(spec: str) -> tuple[Callable[[int], bool], Callable[[int], bool]]:
    """Which steps fail, and after which step aborts fail too."""
    numbers, _, mode = spec.partition(":")
    parts = numbers.split(",")
    if mode not in ("", "every", "once") or (mode != "once" and len(parts) > 1) \
            or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ConfigError(FAULT_ENV, f"must be {_FORMS}, got {spec!r}", f"unset {FAULT_ENV} (a test hook)")
    at = {int(p) for p in parts}
    first = min(at)
    if mode == "once":
        return at.__contains__, lambda _: False
    if mode == "every":
        return lambda k: k >= first, lambda _: False
    return lambda k: k >= first, lambda k: k >= first
