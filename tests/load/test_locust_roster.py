"""How the Locust master tells a local worker's process is gone, and how a lost worker is named."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from itlbench.load.locust.roster import lost_reason, process_gone, process_identity, watchable


def test_a_lost_worker_is_named_with_how_it_ended_and_what_it_had_in_flight():
    killed = {"k": 1, "pid": 41, "host": "h", "died_reason": "exited before finishing", "exit_code": -signal.SIGKILL,
              "requests_in_flight": ["s1-0", "s3-0"]}
    remote = {"k": 0, "pid": 7, "host": "far", "died_reason": "stopped sending heartbeats", "exit_code": None}
    assert lost_reason([killed, remote]) == (
        "Locust worker 0 (pid 7 on far) stopped sending heartbeats; Locust worker 1 (pid 41 on h) was killed by "
        "SIGKILL (2 request(s) in flight set aside in in_flight_chunks/): the run stopped, as the load left would "
        "measure another one")
    assert "Locust worker 1 (pid 41 on h) exited with code 3:" in lost_reason([{**killed, "exit_code": 3,
                                                                                "requests_in_flight": []}])


def test_a_local_worker_is_watched_by_its_process_and_a_foreign_one_is_not():
    me = process_identity()
    started = watchable(me)
    assert started is not None and not process_gone(psutil.Process().pid, started)
    assert process_gone(psutil.Process().pid, started + 5.0), "the pid now names another process"
    assert watchable({**me, "pid_ns": "pid:[1]"}) is None and watchable({**me, "started": "x"}) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = psutil.Process(child.pid).create_time()
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its parent
        time.sleep(0.01)
    assert process_gone(child.pid, ident)
    child.wait()
    assert process_gone(child.pid, ident)
