"""Client-only attribution against the bundled engine's step log: real runs, both analyses, same gaps."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.analysis.attribution_check import compare
from itlbench.analysis.client_summary import analyze_run_client
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import _window_from
from itlbench.cli.app import app
from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir import load_tables
from tests.support.report_runs import build_run

pytestmark = pytest.mark.e2e


def _run(tmp: Path, name: str, budget: int | None, inject: str | None, streams: int) -> Path:
    engine = EngineConfig(model="cpu-small", chunk_budget=budget, max_num_seqs=32, kv_memory_gib=0.5)
    cfg = RunConfig(workload="chat", streams=streams, inject=inject, duration_s=4.0, warmup_s=0.5,
                    drain_timeout_s=60.0, seed=3, out=tmp / name, engine=engine, live=False)
    return run_load_test(cfg)[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("attr")
    return {"chunked": _run(tmp, "chunked", 512, "4k@1s", 6), "unchunked": _run(tmp, "unchunked", None, None, 4)}


def _compare(run_dir: Path) -> dict:
    meta = json.loads((run_dir / "run.json").read_text())
    return compare(load_tables(run_dir), _window_from(meta), StallParams.from_meta(meta))


def test_client_names_the_prefill_the_step_log_names(runs: dict[str, Path]) -> None:
    result = _compare(runs["chunked"])
    assert result["prefill_stalled_s"] > 1.0, "a 4k prompt at budget 512 stalls six streams for seconds"
    assert result["same_frac"] >= 0.95, result["causes"]
    assert result["false_prefill_s"] <= 0.05 * result["stalled_s"]
    steps = result["steps"]
    assert steps["coverage"] > 0.5 and steps["all"]["abs_p50_ms"] < 2.0, steps


def test_client_summary_names_the_injected_prompt_from_client_records_alone(runs: dict[str, Path]) -> None:
    summary = analyze_run_client(runs["chunked"])
    stalls = summary["stalls"]
    assert stalls["attribution_source"] == "client_inferred"
    assert summary["split"]["source"] == "client_inferred" and summary["split"]["prefill_s"] > 0
    top = max(stalls["attribution"], key=lambda e: e["worst_s"])
    injected = pl.read_parquet(runs["chunked"] / "requests/*.parquet").filter(pl.col("injected"))["request_id"][0]
    assert top["cause"] == "prefill" and top["injected_request_ids"] == [injected], top
    assert set(stalls["by_cause"]) <= {"prefill", "client", "scrape", "preemption", "unknown"}


def test_no_injected_prompt_is_named_without_an_injection(runs: dict[str, Path]) -> None:
    result = _compare(runs["unchunked"])
    assert result["client_injected_named"] == 0
    summary = analyze_run_client(runs["unchunked"])
    assert summary["stalls"]["events_with_injected_prefill"] == 0
    if result["prefill_stalled_s"] > 0:  # the streams' own 500-token prompts, one step each
        assert result["same_frac"] >= 0.95, result["causes"]


def test_analyze_attribution_client_writes_summary_client_beside_summary(runs: dict[str, Path]) -> None:
    run_dir = runs["unchunked"]
    before = (run_dir / "summary.json").read_text()
    out = CliRunner().invoke(app, ["analyze", str(run_dir), "--attribution", "client", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads((run_dir / "summary-client.json").read_text())
    assert doc["stalls"]["attribution_source"] == "client_inferred"
    assert doc["attribution"]["ignored"] == ["steps", "server_metrics"]
    assert (run_dir / "summary.json").read_text() == before
    # why there are no GPU samples is run.json's, as in summary.json (was: "a run from before it was sampled")
    assert doc["gpu"] == json.loads(before)["gpu"] and "from before" not in doc["gpu"]["nvml"], doc["gpu"]
    bad = CliRunner().invoke(app, ["analyze", str(run_dir), "--attribution", "oracle"])
    assert bad.exit_code == 2 and "--attribution" in bad.output and "Traceback" not in bad.output


def test_external_run_without_step_log_gets_its_prefill_named(tmp_path: Path) -> None:
    """The hand-built external run: no step log, user-space stamps, an 8k prompt over [5.0, 6.5] s (sent
    here 2 ms before the silence began: a request cannot join a step that started before it was sent)."""
    from itlbench.analysis.client_summary import summarize_client

    run_dir = build_run(tmp_path / "ext", external=True)
    meta = json.loads((run_dir / "run.json").read_text())
    tables = load_tables(run_dir)
    tables["requests"] = tables["requests"].with_columns(
        pl.when(pl.col("request_id") == "inj-000").then(pl.col("sent_ns") - 3_000_000).otherwise(pl.col("sent_ns"))
        .alias("sent_ns"))
    summary = summarize_client(tables, _window_from(meta), None, StallParams.from_meta(meta))
    stalls = summary["stalls"]
    counters = summary["crosscheck"]["server_counters"]  # the scraped vLLM sums: a second source beside
    assert counters["source"].startswith("server_metrics:vllm") and counters["prefill_s"] > 0
    assert stalls["count"] == 4
    assert stalls["by_cause"] == {"prefill": {"count": 4, "stalled_s": pytest.approx(stalls["stalled_s"])}}
    assert stalls["attribution"][0]["injected_request_ids"] == ["inj-000"]


def test_a_silence_no_first_token_ends_stays_unknown_with_its_reason(tmp_path: Path) -> None:
    """The same external run without the injected request: the streams' silence has nothing to explain it."""
    from itlbench.analysis.client_summary import summarize_client

    run_dir = build_run(tmp_path / "ext", external=True)
    meta = json.loads((run_dir / "run.json").read_text())
    tables = {name: (t.filter(pl.col("request_id") != "inj-000") if name in ("requests", "chunks") else t)
              for name, t in load_tables(run_dir).items()}
    stalls = summarize_client(tables, _window_from(meta), None, StallParams.from_meta(meta))["stalls"]
    assert stalls["count"] == 4 and set(stalls["by_cause"]) == {"unknown"}
    assert stalls["by_unknown_reason"]["silent"]["count"] == 4
    top = stalls["attribution"][0]
    assert top["cause"] == "unknown" and top["unknown_reason"] == "silent" and top["prefill_request_ids"] == []
