"""Locust across hosts: a worker in its own network namespace, behind a veth pair made by the test,
joins a master bound (`--master-bind`) to the veth address in the root namespace, and loads a paced
server bound there too — nothing on loopback between them. Then a worker whose link is cut mid-run.

Needs root and `ip` (iproute2); skipped with the reason otherwise. Locust is never imported here."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import pytest

from itlbench.harness.locust_run import drive_locust
from itlbench.load.driver import DriveResult, Warmup
from itlbench.load.locust.job import LocustJob
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore

FIXED = "itlbench.testing.plans:fixed_streams"


@dataclass
class Link:
    ns: str
    host_if: str  # the root namespace's end of the veth pair
    host_ip: str  # the master's and the server's address
    ns_ip: str  # the worker's


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _cannot_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "needs `ip` (iproute2)"
    if os.geteuid() != 0:
        return "needs root to make a network namespace and a veth pair"
    probe = f"itlbprobe{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


pytestmark = pytest.mark.skipif(_cannot_make_namespaces() is not None, reason=str(_cannot_make_namespaces()))


@pytest.fixture
def link() -> Iterator[Link]:
    """A namespace and a veth pair 10.200.N.1/30 (root) <-> 10.200.N.2/30 (namespace), removed after."""
    n = os.getpid() % 250 + 1
    link = Link(f"itlb{os.getpid()}", f"vh{os.getpid()}"[:15], f"10.200.{n}.1", f"10.200.{n}.2")
    peer = f"vn{os.getpid()}"[:15]
    try:
        for cmd in (["netns", "add", link.ns],
                    ["link", "add", link.host_if, "type", "veth", "peer", "name", peer, "netns", link.ns],
                    ["addr", "add", f"{link.host_ip}/30", "dev", link.host_if],
                    ["link", "set", link.host_if, "up"],
                    ["-n", link.ns, "addr", "add", f"{link.ns_ip}/30", "dev", peer],
                    ["-n", link.ns, "link", "set", peer, "up"],
                    ["-n", link.ns, "link", "set", "lo", "up"]):
            done = _ip(*cmd)
            assert done.returncode == 0, f"ip {' '.join(cmd)}: {done.stderr}"
        yield link
    finally:
        left = _ip("netns", "pids", link.ns).stdout.split()
        for pid in left:  # only ever processes this test started there
            psutil.Process(int(pid)).kill()
        _ip("link", "del", link.host_if)  # deleting one end removes the pair
        _ip("netns", "del", link.ns)


@pytest.fixture
def server(link: Link) -> Iterator[str]:
    """The paced server on the veth address: reachable from the namespace, never through loopback."""
    proc = subprocess.Popen([sys.executable, "-m", "itlbench.testing.paced_server", "--host", link.host_ip,
                             "--port", "0", "--tick-s", "0.01"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("PORT "), line
    yield f"http://{link.host_ip}:{int(line.split()[1])}/v1"
    proc.kill()
    proc.wait()


def _drive(link: Link, url: str, run_dir: Path, *, duration_s: float,
           during: Any = None) -> tuple[DriveResult, dict[str, Any], list[subprocess.Popen[str]]]:
    """A one-worker Locust run whose master binds the veth address; the worker is started, as the
    printed command says, inside the namespace. `during(worker_process)` runs beside the load."""
    job = LocustJob.for_plan(Target(url, "paced", timeout_s=30.0), run_dir, duration_s=duration_s, factory=FIXED,
                             plan_kwargs={"streams": 3, "tokens": 30}, workers=1, master_bind=f"{link.host_ip}:0",
                             warmup=Warmup(min_s=0.3), drain_timeout_s=5.0, worker_wait_s=60.0)
    statuses: list[str] = []
    workers: list[subprocess.Popen[str]] = []
    doc: dict[str, Any] = {}

    async def start_worker() -> None:
        while not any("locust-worker" in s for s in statuses):
            await asyncio.sleep(0.05)
        command = next(s for s in statuses if "locust-worker" in s).split("`")[1].split()
        token, args = command[0].partition("=")[2], command[3:]  # TOKEN=… itlbench locust-worker --master H:P
        assert args[:2] == ["--master", f"{link.host_ip}:{args[1].rpartition(':')[2]}"], command
        workers.append(subprocess.Popen(["ip", "netns", "exec", link.ns, sys.executable, "-m", "itlbench",
                                         "locust-worker", *args], env={**os.environ, "ITLBENCH_LOCUST_TOKEN": token},
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if during is not None:
            await during(workers[0])

    async def main() -> DriveResult:
        side = asyncio.create_task(start_worker())
        try:
            return await drive_locust(job, store, on_status=statuses.append, driver_doc=doc)
        finally:
            side.cancel()

    store = RunStore(run_dir)
    try:
        return asyncio.run(main()), doc, workers
    finally:
        store.close()


def _master_pids() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)
            if any("itlbench.load.locust.master" in a for a in p.cmdline())]


def test_a_worker_in_another_namespace_loads_through_a_master_bound_to_the_veth(link: Link, server: str,
                                                                               tmp_path: Path):
    res, doc, workers = _drive(link, server, tmp_path, duration_s=2.0)
    out = workers[0].communicate(timeout=60)[0]
    assert res.stop_reason == "completed", out[-2000:]
    assert workers[0].returncode == 0, out[-2000:]
    (w,) = doc["worker_processes"]
    assert w["state"] == "done" and not doc["workers_died"] and doc["master_bind"] == f"{link.host_ip}:0"
    assert w["clock_offset_ns"] is not None and abs(w["clock_offset_ns"]) < 50_000_000, w  # one host's clock
    req, chunks = read_table(tmp_path, "requests"), read_table(tmp_path, "chunks")
    print(f"netns worker: {req.height} requests, {chunks.height} chunks, offset {w['clock_offset_ns']} ns")
    assert req.height >= 3 and (req["status"] == "ok").all(), req.filter(pl.col("status") != "ok")
    assert chunks.height == req["num_chunks"].sum() and (req["output_tokens"] == 30).all()
    assert (tmp_path / "requests" / "part-90000.parquet").is_file(), "the rows came from worker 0, in the namespace"


def test_a_worker_whose_link_is_cut_mid_run_is_named_dead_and_its_rows_are_kept(link: Link, server: str,
                                                                               tmp_path: Path):
    cut: dict[str, float] = {}

    async def cut_the_link(worker: subprocess.Popen[str]) -> None:
        parts = tmp_path / "workers" / "0" / "requests"
        while not list(parts.glob("*.parquet")):  # the master has written rows the worker shipped
            assert worker.poll() is None, "the worker quit"
            await asyncio.sleep(0.05)
        assert _ip("link", "set", link.host_if, "down").returncode == 0
        cut["t"] = time.monotonic()

    t0 = time.monotonic()
    res, doc, workers = _drive(link, server, tmp_path, duration_s=60.0, during=cut_the_link)
    ended_s = time.monotonic() - cut["t"]
    (died,) = doc["workers_died"]
    print(f"cut after {cut['t'] - t0:.1f} s; the run ended {ended_s:.1f} s later: {res.stop_reason}, "
          f"{res.aborted_reason}; {died}")
    assert died["died_reason"] == "stopped sending heartbeats" and died["k"] == 0
    assert res.stop_reason == "aborted" and res.aborted_reason, res
    # far sooner than the 60 s planned: Locust's 3 s heartbeat window plus SILENT_S, with margin for a busy box
    assert ended_s < 40, ended_s
    req = read_table(tmp_path, "requests")
    assert req.height >= 1 and (pl.read_parquet(tmp_path / "requests" / "part-90000.parquet").height == req.height)
    assert read_table(tmp_path, "chunks").filter(pl.col("request_id").is_in(
        req.filter(pl.col("status") == "ok")["request_id"].implode())).height == \
        req.filter(pl.col("status") == "ok")["num_chunks"].sum(), "what the worker shipped is kept whole"
    assert not _master_pids(), "the master outlived its run"
    assert workers[0].poll() is None  # behind a dead link it cannot hear the end: the host's problem (fixture kills it)
