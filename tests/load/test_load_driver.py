"""The driver: closed and open loop, drain, stop, dead servers, client samples."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import polars as pl
import pytest

from itlbench.load.driver import Warmup, drive
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread, spawn
from itlbench.workloads.plan import LoadPlan, RequestPlan
from tests.support.load import closed, run, table

TICK_S = 0.01  # the paced server's tick: every bound on the client's own timing below is one tick


def test_closed_loop_streams_send_back_to_back(tmp_path):
    with serve_in_thread(PacedConfig(tick_s=TICK_S)) as (_, url):
        res = run(closed(2, 3), url, tmp_path, duration_s=1.0)
    req = table(tmp_path, "requests").sort("sent_ns")
    assert res.counts["ok"] == req.height >= 10 and set(req["stream"].to_list()) == {0, 1}
    for _, g in req.group_by("stream"):
        done, sched, sent = g["done_ns"].to_list(), g["scheduled_ns"].to_list(), g["sent_ns"].to_list()
        waits = [(s - d) / 1e9 for d, s in zip(done[:-1], sched[1:], strict=True)]
        assert 0 <= min(waits) and max(waits) < TICK_S  # due as soon as the previous one ended
        assert max((b - a) / 1e9 for a, b in zip(sched, sent, strict=True)) < TICK_S
    assert req["sent_ns"].max() < res.end_ns


def test_open_loop_follows_schedule_and_skips_plans_past_the_end(tmp_path):
    times = [i * 0.1 for i in range(10)] + [1.2, 1.5]
    feed = (RequestPlan(f"o{i}", "chat", "chat", 4, 3, prompt_token_ids=(1, 2, 3, 4), send_at_s=t)
            for i, t in enumerate(times))
    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        res = run(LoadPlan(open_loop=feed), url, tmp_path, duration_s=1.0, warmup_s=0.2)
    req = table(tmp_path, "requests").sort("scheduled_ns")
    assert req.height == 10 and res.open_loop_truncated and res.counts["sent"] == 10
    assert req["stream"].null_count() == 10
    offsets = [(s - res.measure_start_ns) / 1e9 for s in req["scheduled_ns"].to_list()]
    assert max(abs(o - t) for o, t in zip(offsets, times[:10], strict=True)) < 1e-6
    lags = ((req["sent_ns"] - req["scheduled_ns"]) / 1e9).to_list()
    pauses = table(tmp_path, "client_pauses")  # a busy machine's loop stalls, as the watchdog measured them
    worst_pause = ((pauses["end_ns"] - pauses["start_ns"]).max() or 0) / 1e9
    assert min(lags) >= 0 and max(lags) < TICK_S + worst_pause  # sent at its time, never early
    assert res.client.send_lag_max_s == pytest.approx(max(lags))


def test_drain_timeout_cancels_and_records(tmp_path):
    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        t0 = time.perf_counter()
        res = run(closed(3, 10_000), url, tmp_path, duration_s=0.4, drain_timeout_s=0.3)
        assert time.perf_counter() - t0 < 10  # cancelled at the drain timeout, not after 10,000 ticks (100 s)
    req = table(tmp_path, "requests")
    assert res.counts["cancelled"] == 3 and req["status"].to_list() == ["cancelled"] * 3
    chunks = table(tmp_path, "chunks")
    assert chunks.height == req["num_chunks"].sum() > 3 * 40


def test_stop_event_ends_the_run_and_keeps_records(tmp_path):
    async def main(url: str) -> tuple:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        store = RunStore(tmp_path)
        res = await drive(closed(2, 10_000), Target(url, "paced"), store, duration_s=30, drain_timeout_s=30,
                          stop_event=stop)
        store.close()
        return res

    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        res = asyncio.run(main(url))
    assert res.stop_reason == "stop_event" and res.counts["cancelled"] == 2
    assert (res.end_ns - res.run_start_ns) / 1e9 < 10  # stopped, long before its 30 s
    assert table(tmp_path, "requests")["status"].to_list() == ["cancelled"] * 2


def test_cancelled_drive_still_flushes_records(tmp_path):
    async def main(server, url: str) -> None:
        store = RunStore(tmp_path)
        task = asyncio.create_task(drive(closed(2, 10_000), Target(url, "paced"), store, duration_s=30))
        for _ in range(500):  # until the server has sent 30 chunks (load-independent)
            if sum(len(v) for v in server.log.values()) >= 30:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    with serve_in_thread(PacedConfig(tick_s=0.01)) as (server, url):
        asyncio.run(main(server, url))
    assert table(tmp_path, "requests")["status"].to_list() == ["cancelled"] * 2
    assert table(tmp_path, "chunks").height > 20


async def _kill_after_sent(proc, url: str, streams: int, chunks: int) -> None:
    """SIGKILL the server once it has sent `chunks` chunks on each of `streams` streams (its own log)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url.removesuffix("/v1") + "/_log") as resp:
                log = (await resp.json())["sends"]
            if len(log) >= streams and all(len(times) >= chunks for times in log.values()):
                os.kill(proc.pid, signal.SIGKILL)
                return
            await asyncio.sleep(0.05)


def test_server_killed_mid_run(tmp_path):
    proc, url = spawn(PacedConfig(tick_s=0.01))
    duration_s = 30.0
    try:
        async def main() -> tuple:
            killer = asyncio.create_task(_kill_after_sent(proc, url, 4, 20))
            store = RunStore(tmp_path, flush_every_s=0.2)
            res = await drive(closed(4, 10_000), Target(url, "paced"), store, duration_s=duration_s,
                              max_connection_errors=8)
            store.close()
            await killer
            return res

        t0 = time.perf_counter()
        res = asyncio.run(main())
        assert time.perf_counter() - t0 < duration_s / 2  # ended on the errors, not at the end of the run
    finally:
        proc.kill()
        proc.wait()
    assert res.aborted_reason and "connection errors" in res.aborted_reason
    req = table(tmp_path, "requests")
    assert req.height == res.counts["sent"] and set(req["status"].to_list()) == {"error"}
    first = req.filter(pl.col("num_chunks") > 0)
    assert first.height == 4  # the streams cut by the kill keep what they received
    assert table(tmp_path, "chunks").height == first["num_chunks"].sum() >= 4


def test_unreachable_server_aborts_cleanly(tmp_path):
    res = run(closed(2, 5), "http://127.0.0.1:9/v1", tmp_path, duration_s=5, max_connection_errors=5)
    assert res.stop_reason == "aborted" and res.counts["error"] >= 5
    assert table(tmp_path, "requests")["http_status"].null_count() == res.counts["error"]


def test_client_samples_and_progress(tmp_path):
    snaps = []
    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        run(closed(2, 20), url, tmp_path, duration_s=0.8, warmup_s=0.2, sample_interval_s=0.1,
            on_progress=snaps.append)
    samples = table(tmp_path, "client_samples")
    assert samples.height >= 6 and samples.columns == ["t_ns", "loop_lag_s", "cpu_percent", "in_flight", "clock_offset_ns"]
    assert samples["in_flight"].max() == 2 and samples["loop_lag_s"].min() >= 0
    assert len(snaps) >= 6 and snaps[-1].measuring and not snaps[0].measuring
    assert snaps[-1].itl_p50_ms is not None and snaps[-1].itl_p50_ms >= 0.9 * TICK_S * 1e3  # never under a tick
    assert "ITL p50" in snaps[-1].line()


def test_adaptive_warmup_waits_for_every_stream_and_ramp_spreads_first_sends(tmp_path):
    """Measurement opens only once all streams stream (the first tokens take 0.6 s here); the
    ramp spreads the four streams' first sends over 0.3 s; a fixed warmup does neither."""
    warm = Warmup(min_s=0.1, adaptive=True, ramp_s=0.3)
    with serve_in_thread(PacedConfig(tick_s=0.01, first_delay_s=0.6)) as (_, url):
        res = run(closed(4, 20), url, tmp_path / "adaptive", duration_s=0.8, warmup=warm)
        fixed = run(closed(4, 20), url, tmp_path / "fixed", duration_s=0.8, warmup_s=0.1)
    first = (table(tmp_path / "adaptive", "requests").group_by("stream")
             .agg(pl.col("sent_ns").min(), pl.col("first_token_ns").min()).sort("stream"))
    assert res.measure_start_ns >= first["first_token_ns"].max()  # every stream had its first token
    assert fixed.measure_start_ns - fixed.run_start_ns == int(0.1e9)  # a fixed warmup is its length
    for k, sent in enumerate(first["sent_ns"].to_list()):  # ramp slots 0, 75, 150, 225 ms: never early
        assert sent >= res.run_start_ns + int(0.3e9) * k // 4
