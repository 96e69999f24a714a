"""What the Locust master knows of each worker, whether one is gone, and how a lost one is named.

A dead worker took its share of the load with it, so what followed would measure another load: the
master stops the run and it ends `aborted`, as with `--workers` (`multiproc`). Locust notices a dead
worker only by missed heartbeats (about 4 s); a worker in this master's pid namespace on this boot
(every local worker) is watched by its process too, so a killed one is seen within `PROCESS_CHECK_S`.
This module imports no locust: the launcher names the lost workers with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from itlbench.load.locust.job import boot_id
from itlbench.load.multiproc import IN_FLIGHT_DIR

PROCESS_CHECK_S = 0.25  # how often the master looks at its local workers' processes


@dataclass
class WorkerInfo:
    k: int
    client_id: str
    host: str | None = None
    pid: int | None = None
    offset_ns: int | None = None
    state: str = "assigned"  # assigned | ready | done | died
    died_ns: int | None = None
    died_reason: str | None = None
    rows: dict[str, int] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    last_seen: float = field(default_factory=time.monotonic)  # any message from it (rows come every 0.2 s)
    revived: bool = False  # declared dead, then reported done after all (a starved, not a dead, worker)
    batches_dropped: int = 0  # row batches that were not a known table's equal-length columns
    started: float | None = None  # its process's create time, where the master can watch that process

    def doc(self) -> dict[str, Any]:
        return {"k": self.k, "client_id": self.client_id, "host": self.host, "pid": self.pid,
                "clock_offset_ns": self.offset_ns, "state": self.state, "died_ns": self.died_ns,
                "died_reason": self.died_reason, "rows": self.rows, "revived": self.revived,
                "batches_dropped": self.batches_dropped}


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_identity() -> dict[str, Any]:
    """What a worker tells the master so that, sharing its boot and pid namespace, the master can watch it."""
    return {"boot": boot_id(), "pid_ns": _pid_namespace(), "started": psutil.Process().create_time()}


def watchable(identity: object) -> float | None:
    """The worker's create time where its pid means the same process here (same boot and pid namespace),
    else None: then only Locust's heartbeats tell that it died."""
    if not isinstance(identity, dict) or not isinstance(identity.get("started"), float):
        return None
    here = boot_id(), _pid_namespace()
    if None in here or (identity.get("boot"), identity.get("pid_ns")) != here:
        return None
    return identity["started"]


def process_gone(pid: int, started: float) -> bool:
    """The process has exited (not there, a zombie, or its pid now another process's)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE or abs(proc.create_time() - started) > 0.01
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to look at: say nothing
        return False


def _how(died: dict[str, Any]) -> str:
    """`was killed by SIGKILL`, `exited with code 3`, or the master's own words where no exit code is known."""
    code = died.get("exit_code")
    if isinstance(code, int) and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    if isinstance(code, int):
        return f"exited with code {code}"
    return str(died.get("died_reason") or "died")


def lost_reason(died: list[dict[str, Any]]) -> str:
    """Why the run ended, for run.json and the terminal: `Locust worker 0 (pid 41 on host) was killed by SIGKILL
    (2 request(s) in flight set aside in in_flight_chunks/): the run stopped, ...`."""
    parts = []
    for d in sorted(died, key=lambda d: d["k"]):
        n = len(d.get("requests_in_flight") or [])
        aside = f" ({n} request(s) in flight set aside in {IN_FLIGHT_DIR}/)" if n else ""
        parts.append(f"Locust worker {d['k']} (pid {d.get('pid')} on {d.get('host')}) {_how(d)}{aside}")
    return "; ".join(parts) + ": the run stopped, as the load left would measure another one"
