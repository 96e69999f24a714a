"""SIGINT and SIGTERM handled for the length of a block, for waits and loops that end early on either.

A run's metrics linger and a virtual-clock simulation both turn the two signals into an exception that ends
their block cleanly (records written, the signal named), then give the process its previous handlers back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[signal.Signals], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call `on_signal` (which raises to end the block) until the block ends. Outside the main
    thread, where handlers cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        on_signal(signal.Signals(signum))

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
