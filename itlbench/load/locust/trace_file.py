"""The parsed trace a Locust run replays, handed from the launcher to its local workers as a file of arrays.

Every Locust worker rebuilds the run's seeded plan, and a trace replay's plan needs the whole trace (each
worker takes every n-th request of the one merged feed). Parsing a large trace (a million CSV rows: ~1 s)
in every worker repeated what the launcher had already done. So the launcher writes the trace it read as
plain arrays (`np.savez`, no pickle: reading it runs no code) beside the run's job, and names the file only
in the environment of the workers it starts itself (`TRACE_FILE_ENV`): they are on its host. A worker
started by hand (`--master-bind`: usually another machine) gets no such name and reads its own trace file;
nothing of it crosses Locust's message channel. This module imports no locust.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from itlbench.workloads.trace import Trace

TRACE_FILE = "locust_trace.npz"  # in the run directory while the run lasts; removed at its end
TRACE_FILE_ENV = "ITLBENCH_LOCUST_TRACE"  # set by the launcher for the local workers it starts
log = logging.getLogger("itlbench.locust.worker")


def write_trace(trace: Trace, path: Path) -> bool:
    """Write `trace` to `path` (.npz); False where it cannot be written as plain arrays (block ids past
    int64, a full disk): the workers then read the trace themselves."""
    arrays: dict[str, np.ndarray] = {
        "offsets_s": trace.offsets_s, "prompt_tokens": trace.prompt_tokens, "output_tokens": trace.output_tokens,
        "path": np.array(trace.path), "format": np.array(trace.format), "invalid_rows": np.array(trace.invalid_rows)}
    try:
        if trace.blocks is not None:
            arrays["block_counts"] = np.array([len(b) for b in trace.blocks], dtype=np.int64)
            arrays["block_ids"] = np.fromiter((h for b in trace.blocks for h in b), dtype=np.int64)
        with path.open("wb") as fh:
            np.savez(fh, **arrays)
    except (OverflowError, OSError) as exc:
        log.warning("the workers read the trace themselves: cannot hand it over in %s (%s)", path, exc)
        path.unlink(missing_ok=True)
        return False
    return True


def read_trace(path: str | Path) -> Trace:
    """The trace `write_trace` wrote."""
    with np.load(path, allow_pickle=False) as f:
        blocks = None
        if "block_counts" in f:
            ends = np.cumsum(f["block_counts"])
            ids = f["block_ids"].tolist()
            blocks = tuple(tuple(ids[end - n:end]) for n, end in zip(f["block_counts"].tolist(), ends.tolist(),
                                                                     strict=True))
        return Trace(str(f["path"]), f["offsets_s"], f["prompt_tokens"], f["output_tokens"], blocks,
                     str(f["format"]), int(f["invalid_rows"]))


def trace_from_env() -> Trace | None:
    """The trace the launcher handed this worker (None: none handed over, or it cannot be read: the plan then
    reads the trace file itself, as a worker started by hand does)."""
    path = os.environ.get(TRACE_FILE_ENV)
    if not path:
        return None
    try:
        return read_trace(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("reading the trace itself: the launcher's copy %s cannot be read (%s)", path, exc)
        return None
