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

from itlbench.load.clients.http1 import ChunkedDecoder
from itlbench.load.clients.sse_events import SseEvents
from itlbench.load.driver import drive
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, spawn
from itlbench.testing.plans import fixed_streams
from itlbench.testing.proxy import Faults, serve_proxy

MS = 1_000_000


def _delivered_chunks(raw: bytes) -> tuple[str | None, int]:
    """(server id, content chunks) in the bytes one connection was given (one response each here)."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return None, 0
    dec, events, sid, n = ChunkedDecoder(), SseEvents(), None, 0
    try:
        body = dec.feed(raw[head_end + 4:])
    except ConnectionError:
        return None, 0
    for payload in events.feed(body):
        if payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        sid = sid or obj.get("id")
        for c in obj.get("choices") or []:
            n += bool(c.get("text") or (c.get("delta") or {}).get("content"))
    return sid, n


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
        sid, n = _delivered_chunks(raw)
        if sid is None or sid not in rows:
            continue
        status, got_kind, num, rid = rows[sid]
        if status == "cancelled":
            continue
        assert num == n == per_req.get(rid, 0), f"{sid}: proxy delivered {n} chunks, recorded {num}"
        if cut is not None:
            cut_ids.add(sid)
            assert got_kind == kind, (sid, cut, got_kind)
        else:
            assert status == "ok", (sid, got_kind)
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
