"""How many intra-op threads torch gets when serving, from the cores this process may actually use.

Serving runs three busy parties: the engine's forward passes, the HTTP front end that writes every
token, and usually the load generator on the same box. On two cores, torch's default of one thread
per core makes its threads spin and wait on cores the other two need (served decode steps measured
~4x the engine-only figure); one thread, with the front end in its own process, leaves them a core.
Torch-free, so the front end can decide without importing torch.
"""

from __future__ import annotations

import os

from itlbench.errors import ConfigError


def available_cores() -> int:
    """Cores in this process's affinity mask (containers and taskset shrink it), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def serving_threads(requested: int | None, cores: int | None = None) -> int:
    """`requested` when given; otherwise every available core but one, kept for the HTTP front end and
    the client (one thread on a two-core box)."""
    if requested is not None:
        if requested <= 0:
            raise ConfigError("torch_threads", f"must be > 0, got {requested}", "e.g. --torch-threads 1")
        return requested
    cores = available_cores() if cores is None else cores
    return max(1, cores - 1)


def apply_torch_threads(threads: int) -> int:
    """Set torch's intra-op threads (and one inter-op thread, which serving never uses in parallel); returns
    the count torch then reports, which /v1/engine shows."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable before the first inter-op use; harmless if already fixed
        pass
    return int(torch.get_num_threads())
