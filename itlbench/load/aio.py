"""asyncio plumbing the load driver shares: the event loop, Ctrl-C, and tasks that must end or be cancelled."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any


def install_uvloop() -> bool:
    """Use uvloop's faster event loop for later `asyncio.run` calls when it is installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def first_of(*aws: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of several awaitables completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def install_sigint(stop: Callable[[str], None]) -> Callable[[], None]:
    """Ctrl-C stops the run cleanly (records kept) instead of unwinding it; returns the undo."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, stop, "interrupted")
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals
        return lambda: None

    def restore() -> None:
        loop.remove_signal_handler(signal.SIGINT)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

    return restore


async def finish(tasks: set[asyncio.Task], timeout: float) -> None:
    """Let tasks end within `timeout`, then cancel the rest and wait for them to record."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
