"""Whole `itlbench run`s (`run_load_test`, two cases through the CLI) through the fault-injecting proxy, against the
bundled engine served by `itlbench serve` and against the paced server: each run exits 0 with a
summary.json and no traceback; a request the proxy cut carries the fault's error kind; every chunk
the proxy delivered is in the records; the validity verdict names what was disturbed; and where the
proxy only delays, kernel stamps keep the paced server's own send times.

Faults hit only the load's streams (`Faults.only`), not the run's probes or its step-log follower;
delays and the bandwidth limit hit every connection, as a network would."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from itlbench.harness.bundled_server import BundledServer
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir.reader import read_table
from itlbench.testing.paced_server import PacedConfig, spawn
from itlbench.testing.proxy import Faults, delivered_responses, spawn_proxy
from tests.support.servers import PROCESS_ENGINE

MS = 1_000_000
STREAMS = "/completions"
CUT_AFTER = 1500  # bytes: a few chunks into a response (a first connection's head and role chunk are ~300)
FAULTS: dict[str, tuple[Faults, str | None]] = {  # name: (fault, error kind of the requests it cuts)
    "delay": (Faults(latency_s=0.05, jitter_s=0.02, only=STREAMS), None),
    "bandwidth": (Faults(bandwidth_bps=100_000, only=STREAMS), None),
    "reset": (Faults(reset_after=CUT_AFTER, every=2, only=STREAMS), "closed"),
    "half_close": (Faults(half_close_after=CUT_AFTER, every=2, only=STREAMS), "closed"),
    "black_hole": (Faults(black_hole_after=CUT_AFTER, every=3, only=STREAMS), "timeout"),
}


@dataclasses.dataclass
class Server:
    url: str
    model: str
    workload: str
    has_steps: bool  # an itlbench engine on loopback: its step log is followed, on the client's clock


@pytest.fixture(scope="module")
def paced() -> Iterator[Server]:
    proc, url = spawn(PacedConfig(tick_s=0.01))
    yield Server(url, "paced", "fixed:16:40", has_steps=False)
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The bundled engine as a real `itlbench serve` child (engine core in its own process)."""
    log = tmp_path_factory.mktemp("engine") / "server.log"
    with BundledServer(PROCESS_ENGINE, log) as srv:
        yield Server(srv.base_url, "tiny", "fixed:16:24", has_steps=True)


def _run(server: Server, faults: Faults, out: Path, timeout_s: float,
         cli: bool) -> tuple[subprocess.CompletedProcess[str] | None, list[Any]]:
    """One run through the proxy (in its own process); (the CLI's finished process, or None for a run
    made in this process, and the proxy's connections). In this process a run skips the CLI's
    start-up and HTML report, which are most of its CPU; `cli` cases keep the exit code and the output."""
    with spawn_proxy(server.url, faults, out.parent / "proxy.json") as (conns, via):
        if not cli:
            run_load_test(RunConfig(workload=server.workload, streams=3, duration_s=2.0, warmup_s=0.3,
                                    adaptive_warmup=False, request_timeout_s=timeout_s, drain_timeout_s=30.0,
                                    endpoint=via, model=server.model, out=out, live=False))
            p = None
        else:
            p = subprocess.run([sys.executable, "-m", "itlbench", "run", "--endpoint", via, "--model", server.model,
                                "--workload", server.workload, "--streams", "3", "--duration", "2", "--warmup",
                                "0.3", "--no-adaptive-warmup", "--no-live", "--request-timeout", f"{timeout_s}s",
                                "--drain-timeout", "30s", "--out", str(out)], capture_output=True, text=True,
                               timeout=300)
    return p, conns


def _check_delivered(out: Path, conns: list[Any], kind: str | None) -> int:
    """Every response the proxy delivered is recorded with exactly its chunks; a cut one carries
    `kind`, a whole one is ok. Returns how many recorded responses were cut."""
    req, chunks = read_table(out, "requests"), read_table(out, "chunks")
    rows = {sid: r for sid, *r in req.select("server_request_id", "status", "error_kind", "num_chunks",
                                              "request_id").iter_rows() if sid}
    per_req = dict(chunks.group_by("request_id").len().iter_rows())
    cut, seen = 0, set()
    for conn in conns:
        for d in delivered_responses(bytes(conn.delivered)):
            if d.server_id not in rows:
                continue  # a probe or the step log: not a request of the load
            status, got_kind, num, rid = rows[d.server_id]
            seen.add(d.server_id)
            if status == "cancelled":  # in flight at the end of the drain
                continue
            assert num == d.chunks == per_req.get(rid, 0), \
                f"{d.server_id}: proxy delivered {d.chunks} chunks, recorded {num} ({per_req.get(rid, 0)} rows)"
            if d.complete:
                assert status == "ok", (d.server_id, status, got_kind)
            else:
                assert conn.cut is not None and got_kind == kind, (d.server_id, conn.cut, status, got_kind)
                cut += 1
    assert seen == set(rows), f"recorded, never delivered by the proxy: {set(rows) - seen}"
    return cut


CLI_CASES = {("paced", "reset"), ("engine", "black_hole")}  # through `itlbench run` itself: exit code, output


@pytest.mark.e2e
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("which", ["paced", "engine"])
def test_a_whole_run_through_a_broken_network(which: str, fault: str, request: pytest.FixtureRequest,
                                              tmp_path: Path):
    server: Server = request.getfixturevalue(which)
    faults, kind = FAULTS[fault]
    out = tmp_path / "run"
    p, conns = _run(server, faults, out, timeout_s=3.0 if fault == "black_hole" else 60.0,
                    cli=(which, fault) in CLI_CASES)
    if p is not None:
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        assert "Traceback" not in p.stdout + p.stderr and str(out) in p.stdout
        said = " ".join((p.stdout + p.stderr).split())  # the terminal wraps its lines (the summary is on stderr)
        assert "Disturbed between client and engine" in said and "lost their connection" in said
    summary = json.loads((out / "summary.json").read_text())
    cut = _check_delivered(out, conns, kind)
    assert bool(cut) == (kind is not None), f"{cut} recorded requests were cut"
    v, figures = summary["validity"], summary["validity"]["figures"]
    reasons = " | ".join(v["disturbances"])
    print(f"{which}/{fault}: {summary['requests']}, disturbances: {reasons or 'none'}")
    if kind is not None:  # the verdict names the cut connections, by kind
        assert summary["valid"] is False and "lost their connection" in reasons and f"{kind} " in reasons, v
        assert figures["transport_failures_by_kind"][kind] >= 1 and "goodput" in v["affected"]
        assert set(v["disturbances"]) <= set(v["reasons"])
    else:
        assert figures["transport_failures"] == 0 and summary["requests"]["ok"] >= 3
    if which == "engine" and fault == "delay":  # seen as first tokens delivered late after their step
        lag = figures["delivery_lag_p50_s"]
        assert lag is not None and lag >= faults.latency_s * 0.9, figures
        assert "first tokens reached the client a median" in reasons and "ttft_s" in v["affected"]
    if not server.has_steps:  # no step log: a delay cannot be told from the server's own TTFT
        assert figures["delivery_lag_count"] == 0


def test_only_delayed_a_whole_runs_kernel_stamps_keep_the_paced_servers_pace(paced: Server, tmp_path: Path):
    """A constant 40 ms delay on every byte: each recorded chunk gap matches the server's send gap."""
    out = tmp_path / "run"
    _, conns = _run(paced, Faults(latency_s=0.04, only=STREAMS), out, timeout_s=60.0, cli=False)
    _check_delivered(out, conns, None)
    with urllib.request.urlopen(paced.url.removesuffix("/v1") + "/_log", timeout=30) as r:
        sends = json.loads(r.read())["sends"]
    req = read_table(out, "requests").filter(pl.col("status") == "ok")
    chunks = read_table(out, "chunks").sort("request_id", "index")
    assert (chunks["stamp"] == "kernel").all()
    times = dict(chunks.group_by("request_id").agg(pl.col("t_ns").sort()).iter_rows())
    err = [np.diff(times[rid]) - np.diff(sends[sid][-len(times[rid]):])
           for rid, sid in req.select("request_id", "server_request_id").iter_rows() if sid in sends and rid in times]
    errors = np.abs(np.concatenate(err))
    print(f"constant delay: {errors.size} gaps, median error {np.median(errors) / MS:.3f} ms, "
          f"{np.mean(errors < 10 * MS):.1%} within 10 ms")
    assert req.height >= 6 and errors.size > 200
    # same tolerance as the load driver's own test (tests/load/test_fault_proxy.py)
    assert np.median(errors) < 2 * MS and np.mean(errors < 10 * MS) > 0.9
