"""A trace replay reads its trace file once per run: the checks before the run, run.json's plan and the driven
plan share what was read (each once parsed the whole file again, four times a run), and so do the processes
of `--workers N` and of Locust on this host (each parsed it again)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import itlbench.workloads.build as build
from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import check_run, run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir.reader import read_run_doc, read_table
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread
from itlbench.workloads.build import LoadSpec, build_load_plan, read_trace


def _trace(path: Path, rows: int = 40) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{10 + i * 0.05:09.6f},{20 + i},{4 + i % 3}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a trace file the plan builder makes, by path."""
    seen: list[str] = []
    real = build.load_trace

    def counted(path, offset=0, limit=None):
        seen.append(str(path))
        return real(path, offset, limit)

    monkeypatch.setattr(build, "load_trace", counted)
    return seen


def test_an_endpoint_trace_run_reads_its_trace_once(tmp_path: Path, reads: list[str]):
    trace = _trace(tmp_path / "azure.csv")
    with serve_in_thread(PeerConfig(tick_s=0.001)) as (_, url):
        cfg = RunConfig(endpoint=url, model="peer", workload="trace", trace=str(trace), duration_s=2.0,
                        warmup_s=0.0, drain_timeout_s=10.0, request_timeout_s=10.0, out=tmp_path / "run")
        run_dir, _ = run_load_test(cfg, checked=check_run(cfg))  # as `itlbench run` calls it
    assert reads == [str(trace)]
    doc = read_run_doc(run_dir)
    assert doc["plan"]["trace"]["rows"] == 40
    assert read_table(run_dir, "requests").height == 40  # the replay still sends every row


def test_a_bundled_simulator_trace_run_reads_its_trace_once(tmp_path: Path, reads: list[str]):
    trace = _trace(tmp_path / "azure.csv", rows=10)
    cfg = RunConfig(engine=EngineConfig(model="llama-3.1-8b", engine="sim"), workload="trace", trace=str(trace),
                    duration_s=2.0, warmup_s=0.0, out=tmp_path / "run")
    run_dir, _ = run_load_test(cfg)
    assert reads == [str(trace)]
    assert read_table(run_dir, "requests").height == 10


@pytest.mark.e2e
@pytest.mark.parametrize("driver", ["aiohttp", "locust"])
def test_worker_processes_replay_the_trace_the_run_read_without_reading_the_file(tmp_path: Path, driver: str):
    """--workers 2 processes (with Locust: the master and its local workers too) get the trace the run's check
    read: the file is gone before they start, and every row is still sent, once."""
    trace = _trace(tmp_path / "azure.csv")
    with serve_in_thread(PeerConfig(tick_s=0.001)) as (_, url):
        cfg = RunConfig(endpoint=url, model="peer", workload="trace", trace=str(trace), duration_s=2.0,
                        warmup_s=0.0, drain_timeout_s=10.0, request_timeout_s=10.0, out=tmp_path / "run",
                        driver=driver, workers=2)
        checked = check_run(cfg)
        trace.unlink()  # read once, by the check: a process of the run that read it again would fail
        run_dir, _ = run_load_test(cfg, checked=checked)
    req = read_table(run_dir, "requests")
    assert req.height == 40 and (req["status"] == "ok").all() and req["request_id"].n_unique() == 40
    assert read_run_doc(run_dir)["driver"]["workers"] == 2
    assert not list(run_dir.glob("*.npz"))  # the copy handed to Locust's workers is no record of the run


def test_a_trace_read_from_another_file_is_refused(tmp_path: Path):
    one, other = _trace(tmp_path / "one.csv"), _trace(tmp_path / "other.csv")
    spec = LoadSpec(workload="trace", trace_path=str(one), duration_s=10, max_model_len=4096)
    read = read_trace(dataclasses.replace(spec, trace_path=str(other)))
    with pytest.raises(ValueError, match="other.csv"):
        build_load_plan(spec, trace=read)
    assert build_load_plan(spec, trace=read_trace(spec)).description["trace"]["rows"] == 40

