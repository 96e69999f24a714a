"""Serve a peer engine until Ctrl-C or SIGTERM, as the `python -m benchmarks.peers.<engine>_server` scripts do."""

from __future__ import annotations

import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any


def serve_until_signal(server: AbstractContextManager[Any], describe: Callable[[Any], str]) -> None:
    """Start `server`, print `describe(server)`, wait for SIGTERM or SIGINT (which a shell ignores in background
    jobs, hence both), then stop it; an engine not installed (or no such model) is one line, not a traceback."""

    def leave(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    try:
        with server as srv:
            print(describe(srv), flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc}") from None
