"""End to end on the bundled CPU engine: a long prompt stalls unchunked streams, a small budget doesn't."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.report.terminal import LiveProgress

pytestmark = pytest.mark.e2e

TABLE_DIRS = ("requests", "chunks", "steps")


def _run(tmp: Path, name: str, budget: int | None, **kw: object) -> tuple[Path, dict]:
    engine = EngineConfig(model="cpu-small", chunk_budget=budget, max_num_seqs=16, kv_memory_gib=0.5)
    cfg = RunConfig(workload="chat-short", streams=4, inject="6k@2s", duration_s=7.0, warmup_s=1.0,
                    drain_timeout_s=60.0, seed=1, out=tmp / name, engine=engine, live=False, **kw)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with LiveProgress(console, total_s=cfg.duration_s) as live:  # the CLI's live display
        out = run_load_test(cfg, progress=live.update, on_status=live.status)
    assert "ITL p50" in console.file.getvalue()
    return out


def _assert_complete(run_dir: Path) -> None:
    for table in TABLE_DIRS:
        assert list((run_dir / table).glob("*.parquet")), f"{table} has no parquet parts"
    samples = pl.read_parquet(run_dir / "client_samples/*.parquet")
    assert samples.height >= 10, "the client samples its own lag and CPU every 0.5 s for the whole run"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["compaction"]["chunks"]["parts_before"] >= 2, "chunks are flushed while the run goes"
    assert len(list((run_dir / "chunks").glob("*.parquet"))) == run["compaction"]["chunks"]["parts_after"] == 1, \
        "and compacted into one file at its end"
    assert run["end_ns"] > run["measure_start_ns"] >= run["run_start_ns"]
    assert run["versions"]["torch"] and run["hardware"]["cpu_count"] >= 1
    assert run["engine"]["engine"]["model"] == "cpu-small" and run["plan"]["workload"]["name"] == "chat-short"
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("ttft_s", "itl_s", "stalls", "split", "throughput", "goodput", "valid"):
        assert key in summary


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    tmp = tmp_path_factory.mktemp("runs")
    return {"unchunked": _run(tmp, "unchunked", None), "chunked": _run(tmp, "chunked", 256)}


def test_unchunked_injection_stalls_streams_and_is_attributed(two_runs: dict) -> None:
    run_dir, summary = two_runs["unchunked"]
    _assert_complete(run_dir)
    requests = pl.read_parquet(run_dir / "requests/*.parquet")
    injected = requests.filter(pl.col("injected"))
    assert injected.height == 1 and injected["status"][0] == "ok"
    inj_server_id = injected["server_request_id"][0]
    steps = pl.read_parquet(run_dir / "steps/*.parquet")
    inj_steps = steps.filter(pl.col("prefill_request_ids").list.contains(inj_server_id))
    assert inj_steps.height == 1, "unchunked: the whole 6k prompt is one step"
    inj_step_s = (inj_steps["end_ns"][0] - inj_steps["start_ns"][0]) / 1e9
    stalls = summary["stalls"]
    assert stalls["count"] >= 3, "every steady stream should stall behind the 6k prefill"
    assert stalls["worst_s"] >= 0.8 * inj_step_s
    attributed = [ev for ev in stalls["attribution"]
                  if injected["request_id"][0] in json.dumps(ev)]
    assert attributed, f"no stall event names the injected request: {stalls['attribution']}"


def test_small_budget_shrinks_the_worst_gap(two_runs: dict) -> None:
    un_dir, unchunked = two_runs["unchunked"]
    ch_dir, chunked = two_runs["chunked"]
    _assert_complete(ch_dir)
    steps = pl.read_parquet(ch_dir / "steps/*.parquet")
    assert steps["prefill_tokens"].max() + steps["decode_tokens"].max() > 0
    assert (steps["prefill_tokens"] + steps["decode_tokens"]).max() <= 256
    assert chunked["itl_s"]["max"] < 0.5 * unchunked["itl_s"]["max"]


def test_killed_server_keeps_every_record(tmp_path: Path) -> None:
    """Kill the bundled server mid-run: the run ends, errors are recorded, analysis still works."""
    killer_done = threading.Event()

    def kill_server_soon() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            run_json = tmp_path / "killed/run.json"
            if run_json.is_file() and list(tmp_path.glob("killed/chunks/*.parquet")):
                pid = json.loads(run_json.read_text())["target"]["server_pid"]
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        killer_done.set()

    threading.Thread(target=kill_server_soon, daemon=True).start()
    engine = EngineConfig(model="tiny", chunk_budget=64, kv_memory_gib=0.1)
    cfg = RunConfig(workload="chat-short", streams=3, duration_s=30.0, warmup_s=0.5, drain_timeout_s=5.0,
                    out=tmp_path / "killed", engine=engine, live=False)
    started = time.monotonic()
    run_dir, summary = run_load_test(cfg)
    assert killer_done.wait(5)
    assert time.monotonic() - started < 60, "a dead server must end the run promptly"
    requests = pl.read_parquet(run_dir / "requests/*.parquet")
    assert (requests["status"] == "error").any()
    assert pl.read_parquet(run_dir / "chunks/*.parquet").height > 0
    assert summary["requests"]["error"] >= 1
    assert json.loads((run_dir / "run.json").read_text()).get("aborted_reason")
