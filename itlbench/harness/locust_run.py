"""Run a Locust master and its workers as subprocesses and gather their records into one run directory.

This is what `itlbench run --driver locust` calls; it never imports locust (which monkey-patches the
importing process with gevent). The master (`locust_master`) binds Locust's port on loopback and
`workers` local worker processes connect to it; with `master_bind` the master listens there and
waits for workers started by hand (`itlbench locust-worker --master HOST:PORT`, printed as a status).
Master and workers run in their own sessions, so a Ctrl-C reaches only this process, which stops the
master cleanly (SIGTERM: stop sending, cancel in-flight requests, ship every record). The master
writes the records per worker (`<run>/workers/<k>/`); they are merged into the run's tables like the
multi-process driver's (`multiproc.merge_worker_parts`), whatever way the run ended. A replayed trace
is parsed once, here: the job tells the master the plan's stream count, and the local workers get the
parsed trace (`locust.trace_file`); workers started by hand read their own copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from itlbench.errors import ItlbenchError
from itlbench.harness.run_config import RunConfig
from itlbench.load.driver import DriveResult, Warmup
from itlbench.load.locust import require_locust
from itlbench.load.locust.auth import TOKEN_ENV, USER_KEY_ENV, new_token
from itlbench.load.locust.job import (
    API_KEY_ENV,
    LOG_FILE,
    RESULT_FILE,
    LocustJob,
    parse_host_port,
    spec_kwargs,
)
from itlbench.load.locust.roster import lost_reason
from itlbench.load.locust.trace_file import TRACE_FILE, TRACE_FILE_ENV, write_trace
from itlbench.load.multiproc import IN_FLIGHT_DIR, merge_worker_parts, set_aside_in_flight
from itlbench.load.observers.client_monitor import ClientStats
from itlbench.load.progress import ProgressSnapshot
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.workloads.build import LoadSpec
from itlbench.workloads.trace import Trace

JOB_FILE = "locust_job.json"
_HANDED = (API_KEY_ENV, USER_KEY_ENV, TRACE_FILE_ENV)  # what a process gets from the launcher, not inherited


def job_for_run(cfg: RunConfig, spec: LoadSpec, target: Target, run_dir: Path,
                streams: int | None = None) -> LocustJob:
    """The Locust job of an `itlbench run`: the same plan, target and timeline the aiohttp driver gets.
    `streams`: the plan's closed-loop streams, as this process built it (the master then need not build it)."""
    warmup = Warmup(min_s=cfg.warmup_s, adaptive=cfg.adaptive_warmup, max_s=cfg.warmup_limit_s, ramp_s=cfg.ramp_s)
    return LocustJob.for_plan(target, run_dir, duration_s=cfg.duration_s, warmup=warmup, plan_kwargs=spec_kwargs(spec),
                              drain_timeout_s=cfg.drain_timeout_s, workers=cfg.workers, master_bind=cfg.master_bind,
                              locust_ui=cfg.locust_ui, locust_ui_port=cfg.locust_ui_port,
                              worker_wait_s=120.0 if cfg.master_bind is None else 900.0, streams=streams)


def worker_command(master_bind: str, port: int, token: str) -> str:
    """What starts a worker by hand: the run's token in its environment (off the process list)."""
    host, _ = parse_host_port(master_bind, "--master-bind")
    if host in ("0.0.0.0", "*", "::"):
        host = socket.gethostname()
    return f"{TOKEN_ENV}={token} itlbench locust-worker --master {host}:{port}"


class _Procs:
    """The master and local worker processes of one run."""

    def __init__(self, job: LocustJob, log_path: Path, trace_file: Path | None = None) -> None:
        self.job = job
        self.trace_file = trace_file  # the replayed trace, handed to the local workers (`trace_file`)
        self.token = new_token()  # this run's: only workers holding it get a share
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.master: asyncio.subprocess.Process | None = None
        self.workers: list[asyncio.subprocess.Process] = []

    async def start_master(self, job_file: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _HANDED}  # the master sends no load
        env[TOKEN_ENV] = self.token
        self.master = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "itlbench.load.locust.master", str(job_file),
            stdout=asyncio.subprocess.PIPE, stderr=self.log, start_new_session=True, env=env)

    async def start_workers(self, port: int, api_key: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _HANDED}
        env[TOKEN_ENV] = self.token
        if api_key:  # never written into the run directory nor sent over Locust's channel
            env[API_KEY_ENV] = api_key
        if self.trace_file is not None:  # on this host: the trace as read here, not parsed again
            env[TRACE_FILE_ENV] = str(self.trace_file)
        for _ in range(self.job.workers):
            self.workers.append(await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "itlbench.load.locust.worker", "--master", f"127.0.0.1:{port}",
                stdout=self.log, stderr=self.log, start_new_session=True, env=env))

    def signal_master(self, sig: int) -> None:
        if self.master is not None and self.master.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.master.send_signal(sig)

    async def close(self, grace_s: float) -> dict[int, int | None]:
        """Wait for everyone to exit (kill after `grace_s`), then drop the handed trace (no record: a copy);
        worker exit codes by pid."""
        procs = [p for p in [self.master, *self.workers] if p is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace_s)
        except TimeoutError:
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        finally:
            self.log.close()
            if self.trace_file is not None:
                self.trace_file.unlink(missing_ok=True)
        return {p.pid: p.returncode for p in self.workers}


async def _read_events(proc: asyncio.subprocess.Process, handle: Callable[[dict[str, Any]], None]) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        handle(event)


async def drive_locust(job: LocustJob, store: RunStore, *, on_progress: Callable[[ProgressSnapshot], None] | None = None,
                       on_status: Callable[[str], None] = lambda s: None, stop_event: asyncio.Event | None = None,
                       driver_doc: dict[str, Any] | None = None, trace: Trace | None = None) -> DriveResult:
    """Run `job` on Locust; records land in `store`'s run directory. `driver_doc` (for run.json) gets
    the workers, which of them died, Locust's versions and its own statistics. `trace`: the trace the plan
    replays as this process read it, handed to the local workers (workers started by hand read their own)."""
    require_locust()
    run_dir = store.path
    doc = driver_doc if driver_doc is not None else {}
    doc.update({"name": "locust", "workers": job.workers, "master_bind": job.master_bind,
                "versions": {n: _version(n) for n in ("locust", "geventhttpclient", "gevent")}})
    job_file = run_dir / JOB_FILE
    api_key = job.target.get("api_key")
    job_file.write_text(replace(job, target={**job.target, "api_key": None}).to_json())
    trace_file = run_dir / TRACE_FILE
    handed = trace is not None and job.master_bind is None and write_trace(trace, trace_file)
    procs = _Procs(job, run_dir / LOG_FILE, trace_file if handed else None)
    events: dict[str, Any] = {"died": [], "errors": []}
    listening = asyncio.get_running_loop().create_future()

    def handle(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "listening" and not listening.done():
            listening.set_result(int(event["port"]))
        elif kind == "status":
            on_status(str(event["text"]))
        elif kind == "progress" and on_progress is not None:
            on_progress(ProgressSnapshot(**event["snapshot"]))
        elif kind == "worker_died":
            events["died"].append(event)
            on_status(f"Locust worker {event['k']} died ({event['reason']})")
        elif kind == "error":
            events["errors"].append(event["text"])

    exit_codes: dict[int, int | None] = {}
    try:
        await procs.start_master(job_file)
        assert procs.master is not None
        reader = asyncio.create_task(_read_events(procs.master, handle))
        port = await _first_port(listening, reader, procs)
        doc["master_port"] = port
        if job.master_bind is None:
            await procs.start_workers(port, api_key)
        else:
            key = f" with {USER_KEY_ENV} set there" if api_key else ""
            on_status(f"waiting for {job.workers} worker(s): start each{key} with "
                      f"`{worker_command(job.master_bind, port, procs.token)}`")
        watcher = asyncio.create_task(_forward_stop(stop_event, procs)) if stop_event is not None else None
        await reader
        if watcher is not None:
            watcher.cancel()
    except asyncio.CancelledError:  # a second Ctrl-C: stop everything now, keep what was written
        procs.signal_master(signal.SIGTERM)
        exit_codes = await procs.close(grace_s=3.0)
        _collect(run_dir, job, doc, events, exit_codes)
        raise
    exit_codes = await procs.close(grace_s=15.0)
    result = _collect(run_dir, job, doc, events, exit_codes)
    _say_lost_in_flight(doc["workers_died"], on_status)
    if result is None:
        raise ItlbenchError(f"the Locust run produced no result: {'; '.join(events['errors']) or 'see the log'}\n"
                            + _tail(run_dir / LOG_FILE))
    return result


async def _first_port(listening: asyncio.Future[int], reader: asyncio.Task[None], procs: _Procs) -> int:
    await asyncio.wait([listening, reader], return_when=asyncio.FIRST_COMPLETED)
    if not listening.done():
        await procs.close(grace_s=5.0)
        raise ItlbenchError("the Locust master did not start\n" + _tail(procs.log_path))
    return listening.result()


async def _forward_stop(stop_event: asyncio.Event, procs: _Procs) -> None:
    await stop_event.wait()
    procs.signal_master(signal.SIGTERM)


def _collect(run_dir: Path, job: LocustJob, doc: dict[str, Any], events: dict[str, Any],
             exit_codes: dict[int, int | None]) -> DriveResult | None:
    """Merge the per-worker records, read the master's result, fill the driver document."""
    merge_worker_parts(run_dir, job.workers)
    path = run_dir / RESULT_FILE
    master = json.loads(path.read_text()) if path.is_file() else {}
    workers = master.get("workers", [])
    for w in workers:
        w["exit_code"] = exit_codes.get(w.get("pid")) if job.master_bind is None else None
    doc["worker_processes"] = workers
    doc["workers_died"] = [{k: w[k] for k in ("k", "host", "pid", "died_reason", "died_ns", "exit_code")}
                           for w in workers if w.get("state") == "died"]
    for died in doc["workers_died"]:
        died["requests_in_flight"] = set_aside_in_flight(run_dir, died["k"])
    doc["locust_stats"] = master.get("locust_stats", [])
    doc["master_cpu_s"] = master.get("master_cpu_s")
    if events["errors"]:
        doc["errors"] = events["errors"]
    res = master.get("result")
    if res is None:
        return None
    if doc["workers_died"]:  # the master's words, with how each worker exited and what it had in flight
        res["stop_reason"], res["aborted_reason"] = "aborted", lost_reason(doc["workers_died"])
    res["client"] = ClientStats(**res["client"])
    return DriveResult(**res)


def _say_lost_in_flight(died: list[dict[str, Any]], on_status: Callable[[str], None]) -> None:
    for w in died:
        lost = w.get("requests_in_flight") or []
        if lost:
            shown = ", ".join(lost[:5]) + (f" +{len(lost) - 5} more" if len(lost) > 5 else "")
            on_status(f"Locust worker {w['k']} died with {len(lost)} request(s) in flight ({shown}): not recorded, "
                      f"their partial chunks set aside in {IN_FLIGHT_DIR}/ (not analysed); what it finished before is kept")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None

