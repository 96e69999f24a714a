"""The Locust driver: master and workers as real processes on loopback, the same records as aiohttp.

Locust is never imported here (it would monkey-patch this test process with gevent): everything runs
through `locust_run`, which starts `locust_master` and `locust_worker` as subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import psutil
import pytest
from typer.testing import CliRunner

from itlbench.analysis.summary import analyze_run
from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ItlbenchError
from itlbench.harness.locust_run import drive_locust
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.load.driver import DriveResult, Warmup, drive
from itlbench.load.locust.job import LocustJob, WarmupGate
from itlbench.load.multiproc import IN_FLIGHT_DIR
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, spawn
from itlbench.testing.plans import fixed_streams

FIXED = "itlbench.testing.plans:fixed_streams"
MS = 1_000_000


def _locust(url: str, run_dir: Path, *, streams: int, tokens: int, duration_s: float, workers: int = 2,
            on_status: Callable[[str], None] = lambda s: None, during: Callable[..., Any] | None = None,
            **job_kw: Any) -> tuple[DriveResult, dict[str, Any]]:
    """A Locust run of `streams` fixed streams; `during(stop_event)` runs beside it."""
    job = LocustJob.for_plan(Target(url, "paced", timeout_s=60.0), run_dir, duration_s=duration_s, factory=FIXED,
                             plan_kwargs={"streams": streams, "tokens": tokens}, workers=workers, **job_kw)
    store, doc = RunStore(run_dir), {}

    async def main() -> DriveResult:
        stop = asyncio.Event()
        side = asyncio.create_task(during(stop)) if during else None
        try:
            return await drive_locust(job, store, on_status=on_status, stop_event=stop, driver_doc=doc)
        finally:
            if side is not None:
                side.cancel()

    try:
        return asyncio.run(main()), doc
    finally:
        store.close()


async def _wait_for(cond: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Poll a condition on disk or in the process table (no fixed sleep stands in for it)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _ui_stats(ui: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(ui + "/stats/requests", timeout=10) as r:
        return json.loads(r.read())["stats"]


def _worker_pids() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)
            if any("itlbench.load.locust.worker" in a for a in p.cmdline())]


def test_warmup_gate_decides_like_the_aiohttp_driver():
    s = 1_000_000_000
    fixed = WarmupGate(Warmup(min_s=2.0), run_start_ns=10 * s, streams=3, duration_s=5.0)
    assert fixed.fixed() and fixed.measure_start(0) == 12 * s and fixed.window(12 * s) == (12 * s, 17 * s)
    gate = WarmupGate(Warmup(min_s=1.0, adaptive=True, max_s=4.0), run_start_ns=0, streams=2, duration_s=5.0)
    gate.with_tokens.update({0, 1})
    assert gate.measure_start(s // 2) is None, "never before min_s"
    assert gate.measure_start(s + 7) == s + 7, "at min_s once every stream has a token"
    late = WarmupGate(Warmup(min_s=1.0, adaptive=True, max_s=4.0), run_start_ns=0, streams=2, duration_s=5.0)
    late.with_tokens.add(0)
    assert late.measure_start(3 * s) is None, "waits for the second stream"
    assert late.measure_start(4 * s) == 4 * s, "but not past max_s"


def test_cli_process_never_imports_locust():
    code = ("import sys, itlbench.cli, itlbench.harness.orchestrate, itlbench.harness.locust_run, itlbench.load.locust.job; "
            "bad = [m for m in ('locust', 'gevent') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("args", "flag"), [
    (["--locust-ui"], "--locust-ui"),
    (["--master-bind", "0.0.0.0:5557"], "--master-bind"),
    (["--driver", "locust", "--master-bind", "5557"], "--master-bind"),
    (["--driver", "gatling"], "--driver"),
    (["--driver", "locust", "--metrics-port", "0"], "--metrics-port"),
])
def test_driver_flags_fail_clearly(args: list[str], flag: str):
    res = CliRunner().invoke(app, ["run", *args])
    assert res.exit_code == 2 and flag in " ".join(res.output.split()), res.output


_WORKER = ("import sys, locust.runners as r; r.CONNECT_TIMEOUT, r.CONNECT_RETRY_COUNT = 0.2, 2; "
           "from itlbench.load.locust.worker import main; main(sys.argv[1:])")


@pytest.mark.parametrize(("master", "said"), [
    ("nohost.invalid:5557", "error: --master: cannot resolve 'nohost.invalid'"),
    ("127.0.0.1:0", "error: --master: port 0 is no master's port"),
    ("127.0.0.1:{free}", "error: --master: no itlbench master answered at 127.0.0.1:{free} within 0 s"),
])
def test_a_worker_pointed_at_no_master_says_so_in_one_line(master: str, said: str):
    """A worker whose master is nowhere: one line naming --master and exit 2, not Locust's five minutes of
    retries ended by a bare ConnectionError traceback (Locust's retries cut to 0.4 s here)."""
    from itlbench.harness.bundled_server import free_port

    free = free_port()
    res = subprocess.run([sys.executable, "-c", _WORKER, "--master", master.format(free=free)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "ITLBENCH_LOCUST_TOKEN": "t" * 32})
    assert res.returncode == 2 and said.format(free=free) in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]


@pytest.mark.e2e
def test_two_workers_on_the_bundled_engine_write_the_same_run_directory(tmp_path: Path):
    engine = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=256, max_model_len=1024, seed=0)
    cfg = RunConfig(workload="chat-short", streams=4, inject="2x200@0.5s,1.5s", inject_max_tokens=8, duration_s=3.0,
                    warmup_s=0.5, drain_timeout_s=60.0, seed=3, out=tmp_path / "run", engine=engine, live=False,
                    driver="locust", workers=2)
    snaps: list[Any] = []
    run_dir, summary = run_load_test(cfg, progress=snaps.append)
    assert any(s.measuring and s.sent for s in snaps), "the master forwards the workers' live progress"
    req, chunks = read_table(run_dir, "requests"), read_table(run_dir, "chunks")
    assert req.height and (req["status"] == "ok").all(), req.filter(pl.col("status") != "ok")
    assert req["request_id"].n_unique() == req.height
    # the schedule: each injection exactly once across both workers, and each stream's requests in plan order
    run = json.loads((run_dir / "run.json").read_text())
    plan = LocustJob.from_json((run_dir / "locust_job.json").read_text()).build_plan()
    injected = req.filter(pl.col("injected")).sort("request_id")
    assert injected["request_id"].to_list() == [f"inj-{i:03d}" for i in range(len(run["plan"]["injections"]))] \
        and injected.height == 4
    assert (injected["prompt_tokens"] == 200).all() and (injected["output_tokens"] == 8).all()
    steady = req.filter(~pl.col("injected"))
    assert sorted(steady["stream"].unique().to_list()) == [0, 1, 2, 3]
    for s, rows in steady.sort("scheduled_ns").group_by("stream", maintain_order=True):
        expected = [next(it) for it in [iter(plan.streams[s[0]])] for _ in range(rows.height)]
        assert rows["request_id"].to_list() == [p.request_id for p in expected]
        assert rows["prompt_tokens"].to_list() == [p.prompt_tokens for p in expected]
        assert rows["max_tokens"].to_list() == [p.max_tokens for p in expected]
    # token counts: exact lengths, every token in a chunk row
    assert (req["output_tokens"] == req["max_tokens"]).all() and (req["output_tokens"] == req["output_tokens_reported"]).all()
    per_req = chunks.group_by("request_id").agg(pl.col("n_tokens").sum(), pl.len().alias("n"))
    joined = req.join(per_req, on="request_id")
    assert joined.height == req.height
    assert (joined["n_tokens"] == joined["output_tokens"]).all() and (joined["n"] == joined["num_chunks"]).all()
    # both workers' parts merged; the run says which driver and how many workers made it
    assert run["compaction"]["requests"]["parts_before"] == 2, "one requests part from each worker"
    assert sorted(p.name for p in (run_dir / "requests").glob("*.parquet")) == ["part-90000.parquet"], \
        "compacted into the first worker's part at the run's end"
    assert not (run_dir / "workers").exists()
    assert run["driver"]["name"] == "locust" and run["driver"]["workers"] == 2 and not run["driver"]["workers_died"]
    assert [w["state"] for w in run["driver"]["worker_processes"]] == ["done", "done"]
    assert run["end_ns"] - run["measure_start_ns"] == 3 * 10**9
    assert read_table(run_dir, "steps").height and read_table(run_dir, "client_samples").height >= 4
    # the analysis reads it unchanged
    assert analyze_run(run_dir) == summary and summary["itl_s"]["p50"] > 0
    assert summary["requests"]["injected"] == 4 and summary["window"]["seconds"] == 3.0


def _errors(run_dir: Path, sends: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """(ITL error ns, client gaps ns, chunks missing) against the paced server's send log."""
    req = read_table(run_dir, "requests").filter(pl.col("status") == "ok")
    chunks = read_table(run_dir, "chunks").sort("request_id", "index")
    times = dict(chunks.group_by("request_id").agg(pl.col("t_ns").sort()).iter_rows())
    err, gaps, missing = [], [], 0
    for rid, sid in req.select("request_id", "server_request_id").iter_rows():
        client, server = np.asarray(times.get(rid, [])), np.asarray(sends[sid])
        missing += len(server) - len(client)
        err.append(np.diff(client) - np.diff(server))
        gaps.append(np.diff(client))
    return np.concatenate(err), np.concatenate(gaps), missing


@pytest.mark.e2e
def test_itl_through_locust_agrees_with_aiohttp_on_the_paced_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Tolerance: both drivers' median ITL error within 1 ms of the server's own send log, their median
    gaps within 1 ms of each other, and 90 % of Locust's gaps within 10 ms of the server's (a 20 ms tick).
    The workers estimate their clock offset as remote workers do (the truth on one host is 0)."""
    monkeypatch.setenv("ITLBENCH_LOCUST_PROBE_CLOCK", "1")
    results, offsets = {}, []
    for driver in ("aiohttp", "locust"):
        proc, url = spawn(PacedConfig(tick_s=0.02, first_delay_s=0.05))
        run_dir = tmp_path / driver
        try:
            if driver == "aiohttp":
                store = RunStore(run_dir)
                asyncio.run(drive(fixed_streams(8, 30), Target(url, "paced"), store, duration_s=3.0,
                                  drain_timeout_s=10.0))
                store.close()
            else:
                _, doc = _locust(url, run_dir, streams=8, tokens=30, duration_s=3.0, drain_timeout_s=10.0)
                offsets = [w["clock_offset_ns"] for w in doc["worker_processes"]]
            with urllib.request.urlopen(url.removesuffix("/v1") + "/_log", timeout=60) as r:
                sends = json.loads(r.read())["sends"]
        finally:
            proc.kill()
            proc.wait()
        results[driver] = _errors(run_dir, sends)
    for driver, (err, _, missing) in results.items():
        assert missing == 0, f"{driver}: chunks the server sent were not recorded"
        assert err.size > 500, driver
        assert abs(np.median(err)) < 1 * MS, f"{driver}: median ITL error {np.median(err) / MS:.3f} ms"
    assert len(offsets) == 2 and all(o != 0 and abs(o) < 5 * MS for o in offsets), offsets
    err, gaps, _ = results["locust"]
    assert abs(np.median(gaps) - np.median(results["aiohttp"][1])) < 1 * MS
    assert np.mean(np.abs(err) < 10 * MS) >= 0.9


@pytest.mark.e2e
def test_a_killed_worker_aborts_the_run_naming_it_and_exits_1(tmp_path: Path):
    """A dead worker took its share of the load: the run stops and ends `aborted` naming the worker and its
    signal, with every record, its summary and report, and exit status 1, as with --workers. Before, the other
    worker ran on alone to the window's end and the run read `completed` (exit 0): half the load, unsaid."""
    out, killed = tmp_path / "run", {}

    def kill_one() -> None:
        deadline = time.monotonic() + 120
        while not all(any((out / "workers" / k / "requests").glob("*.parquet")) for k in "01"):
            assert time.monotonic() < deadline, "the workers shipped no finished request"
            time.sleep(0.05)
        killed["pid"], killed["t_ns"] = _worker_pids()[0], time.perf_counter_ns()
        os.kill(killed["pid"], signal.SIGKILL)

    proc, url = spawn(PacedConfig(tick_s=0.005))
    try:
        threading.Thread(target=kill_one, daemon=True).start()
        res = CliRunner().invoke(app, ["run", "--endpoint", url, "--model", "paced", "--workload", "fixed:16:200",
                                       "--streams", "4", "--duration", "60", "--warmup", "0", "--no-live",
                                       "--driver", "locust", "--workers", "2", "--out", str(out)], terminal_width=200)
    finally:
        proc.kill()
        proc.wait(5)
    assert res.exit_code == 1, res.output
    run = json.loads((out / "run.json").read_text())
    (died,) = run["driver"]["workers_died"]
    assert died["pid"] == killed["pid"] and died["exit_code"] == -signal.SIGKILL, died
    assert run["stop_reason"] == "aborted" and run["aborted_reason"].startswith(
        f"Locust worker {died['k']} (pid {killed['pid']} on {died['host']}) was killed by SIGKILL"), run["aborted_reason"]
    assert run["end_ns"] - killed["t_ns"] < 10 * 10**9, "stopped on the death, not at the 60 s window's end"
    req = read_table(out, "requests")
    assert req["request_id"].n_unique() == req.height and (out / "summary.json").is_file()
    cancelled = req.filter(pl.col("status") == "cancelled")  # the dead worker's requests in flight have no row
    assert cancelled.height == 2 and (cancelled["output_tokens"] > 0).all(), \
        "the other worker's two streams were stopped mid-request and recorded"
    assert req.filter(pl.col("status") == "ok").height >= 2, "what both workers finished before is kept"


@pytest.mark.e2e
def test_a_killed_worker_s_requests_in_flight_are_set_aside_and_said(tmp_path: Path):
    """Chunks of a dead worker's unfinished requests (handed over every 256 chunks) have no request row:
    the analysis read each as a stream frozen to the window's end, a stall of seconds blamed on
    `outside_engine`. They are set aside in in_flight_chunks/, named in run.json and in one status line."""
    proc, url = spawn(PacedConfig(tick_s=0.005))

    def shipped(k: int, table: str) -> bool:
        return any((tmp_path / "workers" / str(k) / table).glob("*.parquet"))

    async def kill_mid_request(stop: asyncio.Event) -> None:
        await _wait_for(lambda: shipped(0, "chunks") and shipped(1, "chunks"))
        assert not shipped(0, "requests") and not shipped(1, "requests"), "killed mid-request"
        psutil.Process(_worker_pids()[0]).send_signal(signal.SIGKILL)

    said: list[str] = []
    try:
        res, doc = _locust(url, tmp_path, streams=4, tokens=1000, duration_s=5.0, drain_timeout_s=2.0,
                           during=kill_mid_request, on_status=said.append)
    finally:
        proc.kill()
        proc.wait()
    (died,) = doc["workers_died"]
    lost = died["requests_in_flight"]
    assert lost, "its 5 s requests were in flight"
    assert any(s.startswith(f"Locust worker {died['k']} died with {len(lost)} request(s) in flight") for s in said), said
    assert res.stop_reason == "aborted" and f"({len(lost)} request(s) in flight set aside in {IN_FLIGHT_DIR}/)" \
        in res.aborted_reason, res.aborted_reason
    chunks, requests = read_table(tmp_path, "chunks"), read_table(tmp_path, "requests")
    assert not chunks.filter(pl.col("request_id").is_in(pl.Series(lost).implode())).height
    assert chunks.filter(~pl.col("request_id").is_in(requests["request_id"].implode())).is_empty()
    kept = pl.read_parquet(tmp_path / IN_FLIGHT_DIR / "*.parquet")  # set aside, not lost
    assert sorted(kept["request_id"].unique().to_list()) == sorted(lost) and kept.height >= len(lost)


@pytest.mark.e2e
def test_printed_worker_command_joins_a_bound_master_and_an_interrupt_keeps_every_record(tmp_path: Path):
    proc, url = spawn(PacedConfig(tick_s=0.01))
    statuses: list[str] = []
    started: list[subprocess.Popen[bytes]] = []

    async def start_worker_then_stop(stop: asyncio.Event) -> None:
        await _wait_for(lambda: any("locust-worker" in s for s in statuses))
        command = next(s for s in statuses if "locust-worker" in s).split("`")[1].split()
        assert command[0].startswith("ITLBENCH_LOCUST_TOKEN=") and command[1:3] == ["itlbench", "locust-worker"]
        env = {**os.environ, "ITLBENCH_LOCUST_TOKEN": command[0].partition("=")[2]}
        started.append(subprocess.Popen([sys.executable, "-m", "itlbench", *command[2:]],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        await _wait_for(lambda: bool(list((tmp_path / "workers" / "0" / "chunks").glob("*.parquet"))))
        ui = next(s for s in statuses if s.startswith("Locust web UI: ")).split()[-1]
        await _wait_for(lambda: "POST" in {e["method"] for e in _ui_stats(ui)})  # Locust's own view, live
        stop.set()  # what Ctrl-C does in `itlbench run`

    try:
        res, doc = _locust(url, tmp_path, streams=3, tokens=3000, duration_s=60.0, workers=1,
                           master_bind="127.0.0.1:0", on_status=statuses.append, during=start_worker_then_stop,
                           locust_ui=True, locust_ui_port=0)
        started[0].wait(30)
    finally:
        proc.kill()
        proc.wait()
        for p in started:
            p.kill()
    assert res.stop_reason == "interrupted" and doc["master_bind"] == "127.0.0.1:0"
    req, chunks = read_table(tmp_path, "requests"), read_table(tmp_path, "chunks")
    cancelled = req.filter(pl.col("status") == "cancelled")
    assert cancelled.height == 3, "each stream's request in flight at the stop is recorded as cancelled"
    assert (cancelled["output_tokens"] > 0).all() and chunks.height == req["num_chunks"].sum()
    assert res.finished_ns - res.end_ns < 10 * 10**9


def test_a_worker_that_cannot_build_the_plan_fails_the_run_with_its_reason(tmp_path: Path):
    job = LocustJob.for_plan(Target("http://127.0.0.1:9/v1", "none"), tmp_path, duration_s=1.0,
                             factory=FIXED, plan_kwargs={"streams": 2, "tokens": 3, "no_such_arg": 1}, workers=1)
    with pytest.raises(ItlbenchError, match="worker 0 on .*TypeError.*no_such_arg"):
        asyncio.run(drive_locust(job, RunStore(tmp_path)))



def test_a_server_refusing_every_request_ends_the_locust_run_with_its_words(tmp_path: Path):
    """A K/V cache of one block refuses every prompt (HTTP 400): the workers give up after 50 failures in a row,
    as the asyncio driver does, and the reason quotes the server's message (Locust has read the body)."""
    engine = EngineConfig(model="tiny", device="cpu", kv_blocks=1, seed=0)
    cfg = RunConfig(workload="chat-short", streams=4, duration_s=30.0, warmup_s=0.5, drain_timeout_s=10.0, seed=3,
                    out=tmp_path / "run", engine=engine, live=False, driver="locust", workers=1)
    run_dir, summary = run_load_test(cfg)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["stop_reason"] == "aborted", run.get("stop_reason")
    assert "50 requests in a row failed, the last with HTTP 400: " in run["aborted_reason"]
    assert "KV blocks but the cache has 1" in run["aborted_reason"]
    req = read_table(run_dir, "requests")
    assert req.height >= 50 and (req["status"] == "error").all()
    assert req["error"].str.contains("KV blocks but the cache has 1").all()
