"""`itlbench analyze` works on a run directory left by `kill -9` after the first flush: run.json holds
the window from the start (kept current at every flush), and every flushed part is read.

A run on the bundled engine killed mid-way (SIGTERM, and SIGKILL) is made once per signal and shared by
the tests that read it: no engine server outlives it, and its report says it was cut short."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import psutil
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.rundir.reader import read_table
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread


def _measured_request_on_disk(out: Path, parts: str) -> bool:
    """A flushed part holds a request scheduled inside the measured window (one scheduled in the
    warmup is, rightly, not counted by the analysis; the first flush may hold only those)."""
    if not (out / "run.json").is_file():
        return False
    measure_start = json.loads((out / "run.json").read_text())["measure_start_ns"]
    return any((pl.read_parquet(p)["scheduled_ns"] >= measure_start).any() for p in out.glob(parts))


def _kill_after_first_flush(cmd: list[str], out: Path, parts: str, sig: signal.Signals) -> tuple[list[int], int]:
    """Send `sig` to the run once a measured request is on disk; (the pids of its process tree then, its exit code)."""
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
        proc.send_signal(sig)
        proc.wait(timeout=120)  # a SIGTERM'd run still writes its summary and report
    return tree, proc.returncode


def _kill9_after_first_flush(cmd: list[str], out: Path, parts: str = "requests/part-*.parquet") -> list[int]:
    """SIGKILL the run once a measured request is on disk; the pids of its process tree then."""
    tree, returncode = _kill_after_first_flush(cmd, out, parts, signal.SIGKILL)
    assert returncode == -signal.SIGKILL and not (out / "summary.json").exists()
    return tree


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # also when it ends between the two looks
        return False


def _gone(pids: list[int], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
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


@dataclass(frozen=True)
class KilledRun:
    out: Path
    returncode: int
    summary_at_exit: bool  # summary.json was there when the run's process had ended
    server_gone: bool  # the engine server was gone within 20 s of the run's end


@pytest.fixture(scope="module")
def killed_bundled_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[signal.Signals], KilledRun]:
    """A bundled-engine run (tiny) killed with the signal once a measured request is on disk, made once per
    signal for every test that reads it (each copies the directory before it writes there)."""
    made: dict[signal.Signals, KilledRun] = {}

    def get(sig: signal.Signals) -> KilledRun:
        if sig not in made:
            out = tmp_path_factory.mktemp(f"bundled-{sig.name}") / "run"
            cmd = [sys.executable, "-m", "itlbench", "run", "--model", "tiny", "--workload", "chat-short",
                   "--streams", "2", "--inject", "1024@1s", "--duration", "60", "--warmup", "0.5", "--no-live",
                   "--out", str(out)]
            _, returncode = _kill_after_first_flush(cmd, out, "requests/part-*.parquet", sig)
            summary_at_exit = (out / "summary.json").exists()
            server_gone = _gone([json.loads((out / "run.json").read_text())["target"]["server_pid"]], 20.0)
            made[sig] = KilledRun(out, returncode, summary_at_exit, server_gone)
        return made[sig]

    return get


def _copy(run: KilledRun, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run.out, tmp_path / "run"))


@pytest.mark.e2e
def test_a_run_killed_with_sigkill_on_the_bundled_engine_can_be_analysed_and_leaves_no_server(
        killed_bundled_run: Callable[[signal.Signals], KilledRun], tmp_path: Path):
    run = killed_bundled_run(signal.SIGKILL)
    assert run.returncode == -signal.SIGKILL and not run.summary_at_exit
    assert run.server_gone, "the engine server outlived its run"
    out = _copy(run, tmp_path)
    summary = _analyze(out)
    assert read_table(out, "steps").height > 0 and summary["requests"]["total"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_run_takes_its_engine_server_down(killed_bundled_run: Callable[[signal.Signals], KilledRun],
                                                 sig: signal.Signals) -> None:
    """SIGTERM ends the run cleanly (records and summary written); even SIGKILL leaves no server."""
    run = killed_bundled_run(sig)
    assert run.server_gone, "the engine server outlived its run"
    if sig == signal.SIGTERM:
        assert run.returncode == 143  # 128 + SIGTERM, the records and summary kept
        assert json.loads((run.out / "summary.json").read_text())["requests"]["total"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_killed_mid_way_gets_a_report_that_says_it_was_cut_short(
        killed_bundled_run: Callable[[signal.Signals], KilledRun], sig: signal.Signals, tmp_path: Path) -> None:
    run = killed_bundled_run(sig)
    if sig == signal.SIGKILL:  # the process died with the run: the report is asked for afterwards
        out = _copy(run, tmp_path)
        assert not (out / "report.html").exists()
        result = CliRunner().invoke(app, ["report", str(out)], terminal_width=200)
        assert result.exit_code == 0, result.output
        expected = "This run was cut short: the run was killed before it wrote its end time"
    else:  # SIGTERM ends the run cleanly, and the run writes its own report
        out = run.out
        assert run.returncode == 143  # 128 + SIGTERM, as the shell reports a terminated process
        expected = "This run was cut short: it was stopped by SIGTERM; it measured"
    html = " ".join((out / "report.html").read_text().split())
    assert expected in html
    assert "cut short" in (out / "report.md").read_text()
    assert all(p.stat().st_size > 5_000 for p in (out / "figures").glob("*.png"))


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
