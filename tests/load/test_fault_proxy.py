"""The load client through a broken network (itlbench.testing.proxy) against the paced server: the
run completes; requests the proxy cut carry the right error kind; every content chunk the proxy
delivered is in the records; and where the proxy only delays, kernel stamps keep the server's pace."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from itlbench.load.driver import drive
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, spawn
from itlbench.testing.plans import fixed_streams
from itlbench.testing.proxy import Faults, delivered_responses, serve_proxy

MS = 1_000_000


def _run(url: str, tmp: Path, reader: str, faults: Faults, timeout_s: float = 20.0):
    with serve_proxy(url, faults) as (proxy, via):
        store = RunStore(tmp)
        res = asyncio.run(drive(fixed_streams(3, 40), Target(via, "paced", timeout_s=timeout_s,
                                                              stream_reader=reader, accepts_token_ids=False),
                                store, duration_s=1.5, drain_timeout_s=timeout_s + 5, handle_sigint=False))
        store.close()
        delivered = proxy.delivered
        cuts = [c.cut for c in proxy.conns]
    return res, delivered, cuts


@pytest.fixture(scope="module")
def paced():
    proc, url = spawn(PacedConfig(tick_s=0.01, usage=True))
    yield url
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("reader", ["kernel", "aiohttp"])
@pytest.mark.parametrize("fault, kind", [
    (Faults(reset_after=1500, every=2), "closed"),
    (Faults(half_close_after=1500, every=2), "closed"),  # a FIN mid chunked body: the connection closed
    (Faults(black_hole_after=1500, every=3), "timeout"),
    (Faults(bandwidth_bps=200_000), None),
])
def test_cut_connections_carry_their_error_kind_and_every_delivered_chunk(paced: str, tmp_path: Path, reader: str,
                                                                          fault: Faults, kind: str | None):
    res, delivered, cuts = _run(paced, tmp_path, reader, fault, timeout_s=3.0 if kind == "timeout" else 20.0)
    assert res.stop_reason == "completed"
    req, chunks = read_table(tmp_path, "requests"), read_table(tmp_path, "chunks")
    rows = dict(zip(req["server_request_id"].fill_null(""), req.select("status", "error_kind", "num_chunks",
                                                                      "request_id").iter_rows(), strict=True))
    per_req = dict(chunks.group_by("request_id").len().iter_rows())
    cut_ids = set()
    for raw, cut in zip(delivered, cuts, strict=True):
        for d in delivered_responses(raw):  # keep-alive: a connection may carry several responses
            if d.server_id not in rows:
                continue
            status, got_kind, num, rid = rows[d.server_id]
            if status == "cancelled":
                continue
            assert num == d.chunks == per_req.get(rid, 0), \
                f"{d.server_id}: proxy delivered {d.chunks} chunks, recorded {num}"
            if not d.complete:  # the response the proxy cut
                assert cut is not None, d
                cut_ids.add(d.server_id)
                assert got_kind == kind, (d.server_id, cut, got_kind)
            else:
                assert status == "ok", (d.server_id, got_kind)
    assert bool(cut_ids) == (kind is not None)


def test_a_constant_delay_keeps_the_servers_pace_in_kernel_stamps(paced: str, tmp_path: Path):
    """Only delayed (40 ms, no jitter): each chunk gap recorded matches the server's send gap."""
    _run(paced, tmp_path, "kernel", Faults(latency_s=0.04))
    with urllib.request.urlopen(paced.removesuffix("/v1") + "/_log", timeout=30) as r:
        sends = json.loads(r.read())["sends"]
    req = read_table(tmp_path, "requests").filter(pl.col("status") == "ok")
    chunks = read_table(tmp_path, "chunks").sort("request_id", "index")
    times = dict(chunks.group_by("request_id").agg(pl.col("t_ns").sort()).iter_rows())
    err = [np.diff(times[rid]) - np.diff(sends[sid][-len(times[rid]):])
           for rid, sid in req.select("request_id", "server_request_id").iter_rows() if sid in sends]
    errors = np.abs(np.concatenate(err))
    assert req.height >= 3 and errors.size > 50
    assert np.median(errors) < 2 * MS and np.mean(errors < 10 * MS) > 0.9
