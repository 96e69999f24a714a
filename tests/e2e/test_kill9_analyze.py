"""`itlbench analyze` works on a run directory left by `kill -9` after the first flush: run.json holds
the window from the start (kept current at every flush), and every flushed part is read."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from itlbench.rundir.reader import read_table
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread


def _measured_request_on_disk(out: Path, parts: str) -> bool:
    """A flushed part holds a request scheduled inside the measured window (one scheduled in the
    warmup is, rightly, not counted by the analysis; the first flush may hold only those)."""
    if not (out / "run.json").is_file():
        return False
    measure_start = json.loads((out / "run.json").read_text())["measure_start_ns"]
    return any((pl.read_parquet(p)["scheduled_ns"] >= measure_start).any() for p in out.glob(parts))


def _kill9_after_first_flush(cmd: list[str], out: Path, parts: str = "requests/part-*.parquet") -> list[int]:
    """SIGKILL the run once a measured request is on disk; the pids of its process tree then."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    tree: list[int] = []
    try:
        while not _measured_request_on_disk(out, parts):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never flushed a request"
            time.sleep(0.05)
        time.sleep(0.5)
        tree = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL and not (out / "summary.json").exists()
    return tree


def _gone(pids: list[int], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _analyze(out: Path) -> dict[str, object]:
    doc = json.loads((out / "run.json").read_text())
    assert doc["provisional"] is True and doc["end_ns"] > doc["measure_start_ns"] >= doc["run_start_ns"]
    assert doc["gpu_telemetry"]["nvml"].startswith("no NVML: "), "the killed run's report must say why no GPU"
    p = subprocess.run([sys.executable, "-m", "itlbench", "analyze", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["total"] > 0
    return summary


def test_a_run_killed_with_sigkill_against_an_endpoint_can_be_analysed(tmp_path: Path):
    out = tmp_path / "run"
    with serve_in_thread(PeerConfig(tick_s=0.005)) as (_, url):
        _kill9_after_first_flush([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer",
                                  "--workload", "chat-short", "--streams", "4", "--duration", "60",
                                  "--warmup", "0.2", "--no-adaptive-warmup", "--no-live", "--out", str(out)], out)
    _analyze(out)


def test_a_multi_process_run_killed_with_sigkill_is_analysed_from_its_workers_parts(tmp_path: Path):
    out = tmp_path / "run"
    with serve_in_thread(PeerConfig(tick_s=0.005)) as (_, url):
        tree = _kill9_after_first_flush([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer",
                                         "--workload", "chat-short", "--streams", "4", "--workers", "2",
                                         "--duration", "60", "--warmup", "0.2", "--no-adaptive-warmup", "--no-live",
                                         "--out", str(out)], out, parts="workers/*/requests/part-*.parquet")
        orphans_gone = _gone(tree)
    assert not list(out.glob("requests/*.parquet")), "nothing was merged: the parts are only in workers/"
    assert read_table(out, "requests").height > 0
    _analyze(out)
    assert orphans_gone, "a worker process outlived its run"


@pytest.mark.e2e
def test_a_run_killed_with_sigkill_on_the_bundled_engine_can_be_analysed_and_leaves_no_server(tmp_path: Path):
    out = tmp_path / "run"
    _kill9_after_first_flush([sys.executable, "-m", "itlbench", "run", "--model", "tiny", "--workload", "chat-short",
                              "--streams", "2", "--duration", "60", "--warmup", "0.5", "--no-live",
                              "--out", str(out)], out)
    pid = json.loads((out / "run.json").read_text())["target"]["server_pid"]
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the engine server outlived its run"
        time.sleep(0.2)
    summary = _analyze(out)
    assert read_table(out, "steps").height > 0 and summary["requests"]["total"] > 0


@pytest.mark.e2e
def test_a_locust_run_killed_with_sigkill_is_analysed_and_leaves_no_master_or_worker(tmp_path: Path):
    """The master and both local workers run in their own sessions (a Ctrl-C reaches only the run):
    they must still die with a run that is SIGKILLed, and the rows the master wrote stay readable."""
    out = tmp_path / "run"
    with serve_in_thread(PeerConfig(tick_s=0.005)) as (_, url):
        tree = _kill9_after_first_flush([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer",
                                         "--workload", "chat-short", "--streams", "4", "--driver", "locust",
                                         "--workers", "2", "--duration", "60", "--warmup", "0.2",
                                         "--no-adaptive-warmup", "--no-live", "--out", str(out)], out,
                                        parts="workers/*/requests/part-*.parquet")
        names = [" ".join(psutil.Process(p).cmdline()) for p in tree if psutil.pid_exists(p)]
        t0 = time.monotonic()
        orphans_gone = _gone(tree)
        print(f"{len(tree)} processes of the killed run gone {time.monotonic() - t0:.1f} s after the SIGKILL")
    assert any("locust.master" in n for n in names) and sum("locust.worker" in n for n in names) == 2, names
    assert not list(out.glob("requests/*.parquet")), "nothing was merged: the parts are only in workers/"
    assert read_table(out, "requests").height > 0
    summary = _analyze(out)
    assert summary["requests"]["ok"] > 0
    assert orphans_gone, "a Locust master or worker outlived its run"
