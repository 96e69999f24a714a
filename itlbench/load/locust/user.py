"""The Locust user of an itlbench run: one user is one closed-loop stream of the workload plan.

Importable by name on every worker (Locust requires it). A user asks the master for a stream index
on start, then runs that stream's plans through its own FastHttpSession until the run's window
closes; a user given no stream (every stream already runs elsewhere) stops at once. Requests,
timestamps and records are the worker's (`worker_run.WorkerRun`); besides its POST timing
(time to response headers), Locust's statistics get a TTFT and an E2E entry per request class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from locust import task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser

if TYPE_CHECKING:
    from itlbench.load.locust.worker_run import WorkerRun


class ItlbenchUser(FastHttpUser):
    """A closed-loop stream. `worker_run` is set by the worker when the master's job arrives."""

    worker_run: ClassVar[WorkerRun | None] = None
    host = "http://127.0.0.1"  # replaced by the job's target before any user spawns
    network_timeout = 600.0  # per read; the job's request timeout replaces it
    connection_timeout = 30.0
    max_retries = 0
    concurrency = 1  # one request at a time per stream

    def on_start(self) -> None:
        run = self.worker_run
        self.stream = run.claim() if run is not None else None

    @task
    def stream_plans(self) -> None:
        run = self.worker_run
        if run is not None and self.stream is not None:
            run.closed_stream(self.stream, self.client)
        raise StopUser()
