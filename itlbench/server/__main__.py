"""`python -m itlbench.server --model tiny --port 8000`."""

import ctypes
import os
import signal
import sys

from itlbench.engine.malloc_tuning import reexec_with_malloc_tunables
from itlbench.errors import ItlbenchError
from itlbench.server.main import parse_args, serve


def _die_with_parent() -> None:
    """When started by `itlbench run` (ITLBENCH_PARENT_PID), ask Linux to SIGTERM this server when
    that process dies, so a killed run never leaves an engine server behind."""
    parent = os.environ.get("ITLBENCH_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):  # the parent died before the request took effect
        sys.exit(0)


def main() -> None:
    reexec_with_malloc_tunables()
    _die_with_parent()
    try:
        serve(parse_args())
    except ItlbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
