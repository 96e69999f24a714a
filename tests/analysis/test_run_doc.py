"""run.json's members the analysis reads: a damaged or hand-edited one is one line naming it (each was a
traceback, or a summary of a window the run never had), and what a real run writes is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.analysis.run_doc import check_run_doc
from itlbench.cli import app
from itlbench.errors import ConfigError
from tests.support.report_runs import build_run

S = 10**9
GOOD = {"run_start_ns": 0, "measure_start_ns": S, "end_ns": 11 * S, "stall_factor": 5.0, "stall_floor_s": 0.05,
        "slo": "itl_p99=150ms", "config": {"engine": {"model": "cpu-small"}}, "engine": {"engine": {}},
        "future_member": [1, "x"]}


@pytest.mark.parametrize(("change", "named"), [
    ({"end_ns": 10**30}, "end_ns (1000000000000000000000000000000) is 1.16e+16 days after run_start_ns"),
    ({"end_ns": -5}, "end_ns (-5) is before run_start_ns (0)"),
    ({"measure_start_ns": "x"}, "measure_start_ns is 'x', not an integer"),
    ({"end_ns": True}, "end_ns is True, not an integer"),
    ({"stall_factor": "x"}, "stall_factor is 'x'; the stall rule needs a number > 1"),
    ({"stall_factor": -1}, "stall_factor is -1; the stall rule needs a number > 1"),
    ({"stall_floor_s": float("nan")}, "stall_floor_s is nan; the stall rule needs seconds >= 0"),
    ({"slo": "itl_p99=nonsense"}, "slo 'itl_p99=nonsense': 'nonsense' is not a positive duration"),
    ({"slo": {"itl_p99": 0.1}}, "slo is {'itl_p99': 0.1}, not the --slo text"),
    ({"engine": "x"}, "engine is 'x', not an object"),
    ({"sim_check": "x"}, "sim_check is 'x', not an object"),
    ({"config": {"engine": [1]}}, "config.engine is [1], not an object"),
], ids=["end-huge", "end-before-start", "measure-text", "end-bool", "factor-text", "factor-negative", "floor-nan",
        "slo-bad", "slo-object", "engine-text", "sim-check-text", "config-engine-list"])
def test_a_member_the_analysis_cannot_read_is_named(change: dict, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_run_doc(GOOD | change, "runs/r1")
    assert str(info.value).startswith(f"runs/r1/run.json: {named}"), str(info.value)
    assert "\n" not in str(info.value)


def test_what_runs_write_is_read() -> None:
    """Members a newer itlbench adds, a killed run's missing window and a run that failed in its warm-up (its end
    before its window opened, orchestrate._window) all pass."""
    check_run_doc(GOOD, "r")
    check_run_doc({"run_start_ns": 5, "measure_start_ns": 5 + S}, "r")
    check_run_doc(GOOD | {"end_ns": S // 2, "slo": None, "config": None, "stall_factor": 2}, "r")


@pytest.mark.parametrize("command", [["analyze"], ["report"], ["analyze", "--attribution", "client"],
                                     ["analyze", "--attribution", "otel"]], ids=["analyze", "report", "client", "otel"])
def test_analyze_and_report_refuse_a_damaged_run_json_and_keep_every_file(tmp_path: Path, command: list) -> None:
    """`engine: "x"` was an AttributeError traceback (report/engines.py); nothing in the run may change."""
    run = build_run(tmp_path / "run")
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(doc | {"engine": "x"}))
    (run / "otel_spans.jsonl").write_text("{}\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, [*command, str(run)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [
        f"error: {run}/run.json: engine is 'x', not an object (restore run.json from a copy of the run directory, "
        "or correct that member)"]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("source", ["client", "otel"])
def test_another_attribution_names_a_run_json_that_is_not_json(tmp_path: Path, source: str) -> None:
    """`analyze --attribution client|otel` read run.json with json.loads: bytes not UTF-8 were a traceback."""
    run = build_run(tmp_path / "run")
    (run / "run.json").write_bytes(b"\xff\xfe{")
    (run / "otel_spans.jsonl").write_text("{}\n")
    result = CliRunner().invoke(app, ["analyze", "--attribution", source, str(run)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [
        f"error: {run}/run.json is not valid JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid "
        "start byte): not a run directory written by `itlbench run`"]
    assert not (run / f"summary-{source}.json").exists()
