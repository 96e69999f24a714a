"""Child processes that die with their parent, so a killed run never leaves a server or engine behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "ITLBENCH_PARENT_PID"


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGTERM this process when its parent dies (PR_SET_PDEATHSIG). Given the pid the
    parent should have, exit at once when it is already gone (the request came too late)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(0)


def die_with_run() -> None:
    """A server started by `itlbench run` (which sets ITLBENCH_PARENT_PID) dies with that run; one
    started by hand is left alone."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent:
        die_with_parent(int(parent))
