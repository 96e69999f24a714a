"""The Locust master of an itlbench run (a subprocess of `itlbench run --driver locust`).

    python -m itlbench.load.locust.master JOB.json

It binds Locust's master port, waits for workers that prove they hold the run's token (`admission`: a
worker that does not is ignored: no job, no users, its messages dropped), hands each its share (`locust_job.MSG_JOB`),
starts one Locust user per closed-loop stream and grants each user a stream index, announces the
start instant and the measurement window (deciding the adaptive warmup from the workers' first-token
reports), and writes the rows the workers ship into one RunStore per worker
(`<run>/workers/<k>/`, flushed as they come: a worker or master that dies keeps what arrived).
A worker that dies (its process gone, or no heartbeats: see `roster`) stops the run, `aborted` naming
it, as with `--workers` (every worker dead: the result is built from what the master holds). It talks
to the launcher with JSON lines on stdout (listening, status, progress, worker_died, done) and stops
cleanly on SIGTERM or SIGINT. Its result, with every worker's DriveResult, goes to
`<run>/locust_result.json`.
"""

from __future__ import annotations

# isort: off
import locust  # noqa: F401 - first: locust monkey-patches the process with gevent at import
# isort: on

import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections import deque
from typing import Any, ClassVar

import gevent
import psutil
from locust import events
from locust.dispatch import UsersDispatcher
from locust.env import Environment
from locust.runners import STATE_MISSING

from itlbench.errors import ItlbenchError
from itlbench.load.driver import DriveResult
from itlbench.load.locust import auth
from itlbench.load.locust.admission import Admission
from itlbench.load.locust.job import (
    MSG_CLAIM,
    MSG_DONE,
    MSG_FAILED,
    MSG_FIRST_TOKEN,
    MSG_GO,
    MSG_GRANT,
    MSG_JOB,
    MSG_PING,
    MSG_PONG,
    MSG_READY,
    MSG_ROWS,
    MSG_STOP,
    MSG_WINDOW,
    RESULT_FILE,
    LocustJob,
    WarmupGate,
    boot_id,
    parse_host_port,
    rows_from_columns,
)
from itlbench.load.locust.roster import PROCESS_CHECK_S, WorkerInfo, lost_reason, process_gone, watchable
from itlbench.load.locust.ui import locust_stats, start_web_ui
from itlbench.load.multiproc import combine_results, merge_progress, worker_dir
from itlbench.load.observers.client_monitor import ClientStats
from itlbench.load.progress import ProgressSnapshot
from itlbench.rundir.store import RunStore

_now = time.perf_counter_ns
log = logging.getLogger("itlbench.locust.master")
SILENT_S = 3.0  # with Locust's missed heartbeats, this long without any message means a dead worker
START_LEAD_S = 0.3  # the start instant is announced this far ahead, so every worker has it in time


def emit(event: str, **data: Any) -> None:
    """One JSON line to the launcher."""
    sys.stdout.write(json.dumps({"event": event, **data}, default=str) + "\n")
    sys.stdout.flush()


class Master:
    def __init__(self, env: Environment, job: LocustJob, bind: tuple[str, int], token: str) -> None:
        self.env, self.job = env, job
        self.runner = env.create_master_runner(*bind)
        self.admission = Admission(self.runner, token, on_refused=lambda cid: emit(
            "status", text=f"refused a Locust worker without this run's token ({cid.rpartition('_')[0]})"))
        self.workers: dict[str, WorkerInfo] = {}
        self.by_k: dict[int, WorkerInfo] = {}
        self.stores: dict[int, RunStore] = {}
        self.free_streams: deque[int] = deque()
        self.streams_total = 0
        self.granted = 0
        self.gate: WarmupGate | None = None
        self.window: tuple[int, int] | None = None
        self.stop_reason: str | None = None
        self.stop_sent = False
        self.progress: dict[int, ProgressSnapshot] = {}
        self._we_stop_locust = False
        self.failure: str | None = None  # a worker could not take its share
        self.next_process_check = 0.0
        self.cpu_at_go = _cpu_s()  # the master's CPU is counted from the start of the load
        r = self.runner
        r.register_message(MSG_READY, self._on_ready)
        r.register_message(MSG_CLAIM, self._on_claim)
        r.register_message(MSG_PING, self._on_ping)
        r.register_message(MSG_FIRST_TOKEN, self._on_first_token)
        r.register_message(MSG_ROWS, self._on_rows)
        r.register_message(MSG_DONE, self._on_done)
        r.register_message(MSG_FAILED, self._on_failed)
        env.events.test_stopping.add_listener(self._on_locust_stopping)

    @property
    def port(self) -> int:
        return int(self.runner.server.port)

    # --- messages -------------------------------------------------------------------------------
    def _info(self, msg: Any) -> WorkerInfo | None:
        w = self.workers.get(msg.node_id)
        if w is not None:
            w.last_seen = time.monotonic()
        return w

    def _on_ready(self, msg: Any, **kw: Any) -> None:
        w = self._info(msg)
        if w is not None:
            w.host, w.pid, w.offset_ns, w.state = msg.data["host"], msg.data["pid"], msg.data["offset_ns"], "ready"
            w.started = watchable(msg.data.get("process")) if isinstance(w.pid, int) else None

    def _on_claim(self, msg: Any, **kw: Any) -> None:
        if self._info(msg) is None:
            return
        stream = self.free_streams.popleft() if self.free_streams else None
        self.granted += stream is not None
        self.runner.send_message(MSG_GRANT, {"nonce": msg.data["nonce"], "stream": stream}, client_id=msg.node_id)

    def _on_ping(self, msg: Any, **kw: Any) -> None:
        if self._info(msg) is None:
            return
        self.runner.send_message(MSG_PONG, {"t0": msg.data["t0"], "t_master": _now()}, client_id=msg.node_id)

    def _on_first_token(self, msg: Any, **kw: Any) -> None:
        if self.gate is not None and self._info(msg) is not None:
            self.gate.with_tokens.add(int(msg.data["stream"]))

    def _on_rows(self, msg: Any, **kw: Any) -> None:
        w = self._info(msg)
        if w is None:
            return
        store = self.stores[w.k]
        data = msg.data if isinstance(msg.data, dict) else {}
        tables = data.get("tables")
        for table, cols in (tables.items() if isinstance(tables, dict) else []):
            rows = rows_from_columns(table, cols)
            if rows is None:  # not a batch of a known table: counted, never a crash
                w.batches_dropped += 1
                continue
            store.add_many(table, rows)
            w.rows[table] = w.rows.get(table, 0) + len(rows)
        progress = data.get("progress")
        if isinstance(progress, dict):
            with contextlib.suppress(TypeError, ValueError):
                self.progress[w.k] = ProgressSnapshot(**progress)

    def _on_done(self, msg: Any, **kw: Any) -> None:
        w = self._info(msg)
        if w is not None:
            w.revived = w.state == "died"
            w.result, w.state = msg.data["result"], "done"
            if w.result.get("aborted_reason"):
                self.request_stop("aborted")

    def _on_failed(self, msg: Any, **kw: Any) -> None:
        if self._info(msg) is None:
            return
        self.failure = f"worker {msg.data['k']} on {msg.node_id.rpartition('_')[0]}: {msg.data['error']}"
        self.request_stop("aborted")

    def _on_locust_stopping(self, **kw: Any) -> None:  # the UI's stop button, not Locust's own on a last worker missing
        if not self._we_stop_locust and not self._all_missing():
            self.request_stop("interrupted")

    def _all_missing(self) -> bool:
        nodes = [self.runner.clients.get(w.client_id) for w in self.workers.values() if w.state != "done"]
        return bool(nodes) and all(n is None or n.state == STATE_MISSING for n in nodes)

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    # --- the run -------------------------------------------------------------------------------
    def wait_for_workers(self) -> None:
        n, deadline = self.job.workers, time.monotonic() + self.job.worker_wait_s
        while len(self.admission.ready()) < n:
            if self.stop_reason or time.monotonic() > deadline:
                strangers = self.admission.strangers()
                refused = f" ({strangers} connected without this run's token: ignored)" if strangers else ""
                raise RuntimeError(f"{len(self.admission.ready())} of {n} workers connected within "
                                   f"{self.job.worker_wait_s:.0f} s{refused}")
            gevent.sleep(0.05)

    def assign(self) -> None:
        """Give the first `workers` trusted workers their index and the job (with its MAC)."""
        ids = self.admission.ready()
        AssignedWorkersDispatcher.assigned = {node.id for node in ids[: self.job.workers]}
        for node in ids[self.job.workers:]:  # more workers than asked for: send the extra ones home
            log.warning("worker %s is not needed (--workers %d); asking it to quit", node.id, self.job.workers)
            self.runner.send_message("quit", client_id=node.id)
        payload = self.job.to_json()
        for k, node in enumerate(ids[: self.job.workers]):
            w = WorkerInfo(k, node.id)
            self.workers[node.id], self.by_k[k] = w, w
            self.stores[k] = RunStore(worker_dir(self.job.run_dir, k))
            mac = self.admission.job_mac(node.id, k, self.job.workers, payload)
            self.runner.send_message(MSG_JOB, {"k": k, "n": self.job.workers, "job": payload, "mac": mac,
                                               "master_host": socket.gethostname(), "master_boot": boot_id()},
                                     client_id=node.id)

    def until(self, done: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            self.check_workers()
            if self.failure or self.aborted_reason:
                raise RuntimeError(self.failure or self.aborted_reason)
            if self.stop_reason == "interrupted":
                raise RuntimeError(f"interrupted while {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:.0f} s {what}")
            gevent.sleep(0.02)

    def check_workers(self) -> None:
        """A worker that died before reporting done stops the run (see `roster`): its share of the load is gone."""
        look = time.monotonic() >= self.next_process_check
        if look:
            self.next_process_check = time.monotonic() + PROCESS_CHECK_S
        for w in self.workers.values():
            if w.state not in ("done", "died") and (why := self._why_dead(w, look)) is not None:
                w.state, w.died_ns, w.died_reason = "died", _now(), why
                emit("worker_died", k=w.k, host=w.host, pid=w.pid, reason=why)
                log.warning("worker %d (pid %s on %s) died: %s", w.k, w.pid, w.host, why)
                self.request_stop("aborted")

    def _why_dead(self, w: WorkerInfo, look: bool) -> str | None:
        """Quit, its process gone, or marked missing by Locust (no heartbeat for 3 s) and silent for `SILENT_S`.
        (A worker starved of CPU may miss heartbeats while still shipping rows: it is not dead. Before the
        start, building the plan may block a worker's heartbeats for a while: they do not count then.)"""
        node = self.runner.clients.get(w.client_id)
        if node is None:
            return "quit before finishing"
        if look and w.started is not None and w.pid is not None and process_gone(w.pid, w.started):
            return "exited before finishing"
        if self.gate is not None and node.state == STATE_MISSING and time.monotonic() - w.last_seen > SILENT_S:
            return "stopped sending heartbeats"
        return None

    @property
    def aborted_reason(self) -> str | None:
        """Why the run was aborted when a worker died (the launcher adds its exit code and requests in flight)."""
        died = [w.doc() for w in self.by_k.values() if w.died_reason is not None]
        return lost_reason(died) if died else None

    def start_users(self, streams: int) -> None:
        self.streams_total = streams
        self.free_streams.extend(range(streams))
        if streams:
            self.runner.start(streams, spawn_rate=max(streams, 1) * 100.0)
            self.until(lambda: self.granted >= streams, 60.0 + streams / 50, "starting the stream users")

    def go(self) -> None:
        run_start = _now() + int(START_LEAD_S * 1e9)
        self.gate = WarmupGate(self.job.build_warmup(), run_start, self.streams_total, self.job.duration_s)
        msg: dict[str, Any] = {"run_start_ns": run_start}
        if self.gate.fixed():
            self.window = self.gate.window(self.gate.min_end_ns)
            msg.update(measure_start_ns=self.window[0], end_ns=self.window[1])
        self.cpu_at_go = _cpu_s()
        self.runner.send_message(MSG_GO, msg)
        emit("status", text="running")

    def supervise(self) -> None:
        """Decide the window, forward progress, watch workers, until every worker is done or died."""
        assert self.gate is not None
        hard_end = (self.gate.max_end_ns + int((self.job.duration_s + self.job.drain_timeout_s + 60) * 1e9))
        last_progress = 0.0
        stop_at: float | None = None
        while not all(w.state in ("done", "died") for w in self.workers.values()):
            now = _now()
            if self.window is None and (start := self.gate.measure_start(now)) is not None:
                self.window = self.gate.window(start)
                self.runner.send_message(MSG_WINDOW, {"measure_start_ns": self.window[0], "end_ns": self.window[1]})
            if now > hard_end:
                self.request_stop("timeout")
            if self.stop_reason and not self.stop_sent:
                self.runner.send_message(MSG_STOP, {"reason": self.stop_reason})
                self.stop_sent, stop_at = True, time.monotonic()
            if stop_at is not None and time.monotonic() - stop_at > 30:
                log.error("workers did not finish within 30 s of the stop")
                break
            self.check_workers()
            if time.monotonic() - last_progress >= 0.5 and self.progress:
                last_progress = time.monotonic()
                snap = merge_progress(list(self.progress.values()))
                emit("progress", snapshot=snap.__dict__)
            gevent.sleep(0.02)

    def result_doc(self) -> dict[str, Any]:
        results = []
        for w in self.by_k.values():
            if w.result is not None:
                d = dict(w.result)
                d["client"] = ClientStats(**d["client"])
                results.append(DriveResult(**d))
        combined = combine_results(results).to_dict() if results else self._orphaned_result()
        if combined is not None and self.stop_reason and combined["stop_reason"] == "completed":
            combined["stop_reason"] = "interrupted" if self.stop_reason == "interrupted" else self.stop_reason
        if combined is not None and self.aborted_reason:
            combined["stop_reason"], combined["aborted_reason"] = "aborted", self.aborted_reason
        return {"result": combined, "workers": [w.doc() for w in self.by_k.values()],
                "window": list(self.window) if self.window else None, "stop_reason": self.stop_reason,
                "run_start_ns": self.gate.run_start_ns if self.gate else None,
                "locust_stats": locust_stats(self.env), "master_cpu_s": _cpu_s() - self.cpu_at_go}

    def _orphaned_result(self) -> dict[str, Any] | None:
        """A run whose every worker died before reporting: the master's window, ended when the first
        worker died, the requests it had received counted. None before the start (nothing measured)."""
        reason = self.aborted_reason
        if self.gate is None or reason is None:
            return None
        start, died = self.window[0] if self.window else self.gate.run_start_ns, min(
            w.died_ns for w in self.workers.values() if w.died_ns is not None)
        return DriveResult(self.gate.run_start_ns, start, max(start, min(self.window[1], died) if self.window else died),
                           _now(), {"sent": sum(w.rows.get("requests", 0) for w in self.workers.values())},
                           "aborted", reason).to_dict()

    def close(self) -> None:
        self._we_stop_locust = True
        for store in self.stores.values():
            store.close()
        try:
            self.runner.stop()
            self.runner.quit()
        except Exception:  # noqa: BLE001 - records are already on disk
            log.exception("stopping Locust")


class AssignedWorkersDispatcher(UsersDispatcher):
    """Locust's dispatcher, kept to the workers that hold a share of the run. A worker that joins
    later gets no users: Locust would otherwise rebalance, stopping users (streams) mid-request."""

    assigned: ClassVar[set[str]] = set()

    def __init__(self, worker_nodes: list[Any], user_classes: list[Any]) -> None:
        super().__init__([w for w in worker_nodes if w.id in self.assigned], user_classes)

    def add_worker(self, worker_node: Any) -> None:
        if worker_node.id in self.assigned:
            super().add_worker(worker_node)


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [master] %(levelname)s %(name)s: %(message)s")
    try:
        token = auth.token_from_env()
        with open(argv[0]) as f:
            job = LocustJob.from_json(f.read())
    except (ItlbenchError, OSError, ValueError) as exc:
        emit("error", text=str(exc))
        return 2
    job.target["api_key"] = None  # workers read the key from their own environment: it never crosses the wire
    bind = parse_host_port(job.master_bind, "--master-bind") if job.master_bind else ("127.0.0.1", 0)
    from itlbench.load.locust.user import ItlbenchUser

    env = Environment(user_classes=[ItlbenchUser], events=events, host=job.build_target().base_url,
                      dispatcher_class=AssignedWorkersDispatcher)
    master = Master(env, job, bind, token)
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, master.request_stop, "interrupted")
    emit("listening", port=master.port)
    code = 0
    try:
        if job.locust_ui:
            emit("status", text=f"Locust web UI: {start_web_ui(env, job.locust_ui_port)}")
        emit("status", text=f"waiting for {job.workers} Locust worker(s) on port {master.port}")
        master.wait_for_workers()
        master.assign()
        master.until(lambda: all(w.state in ("ready",) for w in master.workers.values()), 120.0,
                     "waiting for the workers to build the plan")
        streams = job.closed_streams()  # the launcher's count: the master never reads a replayed trace
        master.start_users(streams)
        master.go()
        master.supervise()
    except Exception as exc:  # noqa: BLE001 - reported to the launcher; the records are kept
        log.exception("the run failed")
        emit("error", text=f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc))
        code = 1
    finally:
        master.close()
        doc = master.result_doc()
        RunStore(job.run_dir).write_json(RESULT_FILE, doc)
        emit("done", result=RESULT_FILE)
    return code


if __name__ == "__main__":
    sys.exit(main())
