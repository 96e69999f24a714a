"""`itlbench capacity` from the command line: an interrupted search exits 130 and says what it had established;
a point whose window held no request ends the search (exit 1) instead of halving on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app, studies

runner = CliRunner()
SIM = ["--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _interrupting_after(real_runs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`itlbench run` as the sweep and capacity call it: `real_runs` real runs, then one Ctrl-C'd before it
    recorded anything (typer turns the KeyboardInterrupt into exit 130)."""
    real, calls = studies.invoke_run, []

    def invoke(args: list[str]) -> int:
        calls.append(args)
        if len(calls) <= real_runs:
            return real(args)
        Path(args[args.index("--out") + 1]).mkdir(parents=True)
        return 130

    monkeypatch.setattr(studies, "invoke_run", invoke)


def test_ctrl_c_during_the_first_point_exits_130_and_says_the_search_was_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupting_after(0, monkeypatch)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--duration", "10", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 130, result.output
    assert "wrote nothing" not in result.output and "error:" not in result.output
    assert ("Search interrupted (Ctrl-C or SIGTERM) at 1 requests/s: no point had finished, so nothing was "
            "established.") in _flat(result.output)
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["interrupted"] is True and doc["interrupted_at"] == 1 and doc["max_rate"] is None


def test_ctrl_c_later_says_what_was_established_not_a_capacity(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupting_after(2, monkeypatch)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--axis", "streams", "--start", "2", "--rate-max", "8", "--slo",
                                 "itl_p99=1s", "--workload", "fixed:128:32", "--duration", "2", "--warmup", "0.5",
                                 "--no-report", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 130, result.output
    text = _flat(result.output)
    assert ("Search interrupted (Ctrl-C or SIGTERM) at 8 streams: so far every SLO held up to 4 streams "
            "(capacity ≥ 4, not confirmed).") in text
    assert "Capacity ≥" not in text and "raise --rate-max" not in text
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["interrupted"] is True and [p["load"] for p in doc["points"]] == [2, 4]
    assert "Search interrupted" in (out / "report.md").read_text()


def test_a_window_too_short_for_the_rate_stops_the_search_with_exit_1(tmp_path: Path) -> None:
    """The tester's command: at 0.5 requests/s a 5 s window held no request; it halved on to 0.0156 before."""
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--slo", "itl_p99=1ms", "--duration", "5", *SIM, "--no-report",
                                 "--out", str(out)], terminal_width=300)
    assert result.exit_code == 1, result.output
    text = _flat(result.output)
    assert "No capacity found: even 1 requests/s misses every SLO, and at 0.5 requests/s the 5 s measured window " \
           "held no request, too short for that load" in text
    assert "give a longer --duration, e.g. --duration 20s" in text
    doc = json.loads((out / "capacity.json").read_text())
    assert [p["load"] for p in doc["points"]] == [1, 0.5] and "held no request" in doc["stopped"]
    assert [r["figures"]["requests"] for r in doc["points"][1]["runs"]] == [0]


def test_a_run_option_the_first_run_refuses_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--no-such-flag", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 2 and "--no-such-flag" in result.output, result.output
    assert not out.exists()
