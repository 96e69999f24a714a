"""Terminal output that outlives its reader: `itlbench run ... 2>&1 | head` must still write the report.

A reader that goes away early (`head`, a closed terminal, a log shipper that died) makes the next write to
the pipe raise BrokenPipeError. Unhandled, it ended the command where it was: a run that had written its
records and summary.json but not yet its report stopped there with exit status 1. The command's files are
what matter, so once a stream's reader is gone its writes are dropped (the descriptor pointed at /dev/null,
so the interpreter's last flush is quiet too) and the command finishes as it would have.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Any, TextIO


class PipeSafe:
    """A text stream's stand-in that drops writes once its reader has closed the pipe; everything else
    (isatty, fileno, encoding: what rich asks of a terminal) is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._lost(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except OSError as exc:
                self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise exc
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def protect_std_streams() -> None:
    """Wrap sys.stdout and sys.stderr (once) so a reader that leaves early cannot end the command."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PipeSafe):
            setattr(sys, name, PipeSafe(stream))
