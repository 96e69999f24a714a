"""A Locust worker process: connects to the master, proves it holds the run's token, takes the job
(only from a master that proves the same, only an allowed plan factory: see `auth`), runs its `WorkerRun`.

    ITLBENCH_LOCUST_TOKEN=... python -m itlbench.load.locust.worker --master HOST:PORT
    (or: itlbench locust-worker ...; the bearer key comes from this process's ITLBENCH_API_KEY)
"""

from __future__ import annotations

# isort: off
import locust  # noqa: F401 - first: locust monkey-patches the process with gevent at import
# isort: on

import argparse
import logging
import os
import socket
import sys
from typing import Any

import gevent.event
import locust.runners
from locust import events
from locust.env import Environment

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.load.locust import auth
from itlbench.load.locust.job import (
    MSG_FAILED,
    MSG_GO,
    MSG_GRANT,
    MSG_JOB,
    MSG_PING,
    MSG_PONG,
    MSG_READY,
    MSG_STOP,
    MSG_WINDOW,
    LocustJob,
    parse_host_port,
)
from itlbench.load.locust.job import boot_id as _boot_id
from itlbench.load.locust.roster import process_identity
from itlbench.load.locust.trace_file import trace_from_env
from itlbench.load.locust.user import ItlbenchUser
from itlbench.load.locust.worker_run import PROBE_CLOCK_ENV, WorkerRun, _now

log = logging.getLogger("itlbench.locust.worker")


class Worker:
    """Wires a Locust WorkerRunner to a WorkerRun (created when the master sends the job)."""

    def __init__(self, env: Environment, token: str) -> None:
        self.env = env
        self.runner = env.runner
        self.token = token
        self.nonce = auth.new_nonce()  # ours: the master's proof and the job's MAC are bound to it
        self.master_ok = False
        self.run: WorkerRun | None = None
        self.pongs: dict[int, gevent.event.AsyncResult] = {}
        r = self.runner
        r.register_message(MSG_JOB, self._on_job, concurrent=True)
        r.register_message(MSG_GRANT, lambda msg, **kw: self.run and self.run.on_grant(msg.data))
        r.register_message(MSG_GO, lambda msg, **kw: self.run and self.run.on_go(msg.data))
        r.register_message(MSG_WINDOW, lambda msg, **kw: self.run and self.run.on_window(msg.data))
        r.register_message(MSG_STOP, lambda msg, **kw: self.run and self.run.stop(msg.data["reason"]))
        r.register_message(MSG_PONG, self._on_pong)
        r.register_message(auth.MSG_CHALLENGE, self._on_challenge)
        env.events.test_stop.add_listener(self._on_locust_stop)
        r.send_message(auth.MSG_HELLO, {"nonce": self.nonce})

    def _on_challenge(self, msg: Any, **kw: Any) -> None:
        """The master proves it knows the token; we prove it back over its nonce."""
        d = msg.data if isinstance(msg.data, dict) else {}
        cid = self.runner.client_id
        if not auth.verify(self.token, d.get("mac"), "master", self.nonce, cid) or not isinstance(d.get("nonce"), str):
            log.error("the master at --master does not hold this run's token (%s): ignoring it", auth.TOKEN_ENV)
            return
        self.master_ok = True
        self.runner.send_message(auth.MSG_PROOF, {"mac": auth.worker_proof(self.token, d["nonce"], cid)})

    def _on_locust_stop(self, **kw: Any) -> None:
        """Locust stopped the users (its web UI's stop button): finish the run, records kept."""
        if self.run is not None and not self.run.closed.is_set():
            self.run.stop("interrupted")

    def _on_pong(self, msg: Any, **kw: Any) -> None:
        result = self.pongs.pop(msg.data["t0"], None)
        if result is not None:
            result.set((msg.data["t0"], msg.data["t_master"], _now()))

    def clock_offset(self, master_host: str, master_boot: str | None, k: int, probes: int = 8) -> int:
        """Master clock minus ours. One host shares CLOCK_MONOTONIC: exactly 0. Elsewhere, the probe
        with the shortest round trip: master time - midpoint of our send and receive."""
        same_host = master_host == socket.gethostname() and master_boot and master_boot == _boot_id()
        if same_host and os.environ.get(PROBE_CLOCK_ENV) != "1":
            return 0
        best: tuple[int, int] | None = None
        for _ in range(probes):
            t0 = _now()
            result = self.pongs[t0] = gevent.event.AsyncResult()
            self.runner.send_message(MSG_PING, {"k": k, "t0": t0})
            _, t_master, t1 = result.get(timeout=10)
            rtt, offset = t1 - t0, t_master - (t0 + t1) // 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        log.info("clock offset to master %.3f ms (round trip %.3f ms)", best[1] / 1e6, best[0] / 1e6)
        return best[1]

    def _on_job(self, msg: Any, **kw: Any) -> None:
        d = msg.data if isinstance(msg.data, dict) else {}
        if not self.master_ok or self.run is not None or not auth.verify(
                self.token, d.get("mac"), "job", self.nonce, self.runner.client_id, str(d.get("k")), str(d.get("n")),
                str(d.get("job"))):
            log.error("refused a job that does not carry this run's MAC (or a second job)")
            return
        try:
            self._take_job(msg.data)
        except Exception as exc:  # noqa: BLE001 - the master stops the run and says why
            log.exception("cannot take the job")
            self.runner.send_message(MSG_FAILED, {"k": msg.data["k"], "error": f"{type(exc).__name__}: {exc}"})

    def _take_job(self, d: dict[str, Any]) -> None:
        job = LocustJob.from_json(d["job"])  # checks the plan factory against the allow-list
        job.target["api_key"] = auth.worker_api_key()  # ours, whatever the job says
        offset = self.clock_offset(d["master_host"], d.get("master_boot"), d["k"])
        ItlbenchUser.host = job.build_target().base_url
        ItlbenchUser.network_timeout = job.build_target().timeout_s or 1e9
        self.run = WorkerRun(self.env, d["k"], d["n"], job, offset, trace_from_env())
        ItlbenchUser.worker_run = self.run
        self.runner.send_message(MSG_READY, {"k": d["k"], "host": socket.gethostname(), "pid": os.getpid(),
                                             "offset_ns": offset, "process": process_identity()})


def master_address(text: str) -> tuple[str, int]:
    """--master as (host, port), refused at once where no master can be: port 0, or a host name that does
    not resolve (Locust would retry it silently for five minutes)."""
    host, port = parse_host_port(text, "--master")
    if port == 0:
        raise ConfigError("--master", "port 0 is no master's port", "pass the HOST:PORT `itlbench run` prints")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError("--master", f"cannot resolve {host!r} ({exc.strerror})",
                          "give the master's host name or address") from None
    return host, port


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="An itlbench Locust worker: connects to the master of `itlbench run "
                                            "--driver locust` and runs its share of the load.")
    p.add_argument("--master", required=True, help="HOST:PORT the master binds (printed by itlbench run).")
    args = p.parse_args(argv)
    try:
        host, port = master_address(args.master)
        token = auth.token_from_env()
    except ItlbenchError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [worker {os.getpid()}] %(levelname)s %(name)s: %(message)s")
    env = Environment(user_classes=[ItlbenchUser], events=events)
    wait_s = locust.runners.CONNECT_TIMEOUT * locust.runners.CONNECT_RETRY_COUNT
    log.info("connecting to the master at %s:%d (waiting up to %d s for it)", host, port, wait_s)
    try:
        env.create_worker_runner(host, port)
    except ConnectionError:  # Locust gave up retrying: say so, not its bare traceback
        sys.stderr.write(f"error: --master: no itlbench master answered at {host}:{port} within {wait_s:.0f} s "
                         "(start `itlbench run --driver locust --master-bind HOST:PORT` first, and pass the "
                         "address it prints)\n")
        sys.exit(2)
    Worker(env, token)
    env.runner.greenlet.join()


if __name__ == "__main__":
    main()
