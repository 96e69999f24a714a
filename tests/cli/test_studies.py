"""`itlbench sweep` from the command line: what it refuses (one line, exit 2, nothing written), what the docs
promise it takes, and an interrupted sweep's report and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app, studies
from itlbench.cli.run import said_once, sim_intro_once

runner = CliRunner()
SIM = ["--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100"]
SHORT = ["--workload", "fixed:128:16", "--streams", "2", "--duration", "1", "--warmup", "0.2", "--no-report",
         "--no-live"]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("budgets", "says"), [
    ("8k,8192", "error: --chunk-budget: '8k' and '8192' are the same budget (list each value once)"),
    ("512,0.5k", "error: --chunk-budget: '512' and '0.5k' are the same budget (list each value once)"),
    ("512,2048,-1", "error: --chunk-budget: -1 turns chunking off only in a --serve command (SGLang's "
                    "--chunked-prefill-size -1) (the bundled engine spells it none)"),
])
def test_budgets_refused_in_one_line_before_anything_is_written(tmp_path: Path, budgets: str, says: str) -> None:
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--chunk-budget", budgets, *SIM, "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == says and not out.exists()


def test_policy_both_reaches_the_runs(tmp_path: Path) -> None:
    """The first run refuses an option of its own: the sweep got past --policy both."""
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--policy", "both", "--chunk-budget", "512", *SIM, "--no-such-flag",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2 and "--policy" not in result.output and "--no-such-flag" in result.output
    assert not out.exists()


def test_minus_one_goes_into_a_serve_command_as_typed(tmp_path: Path) -> None:
    """docs/reports.md's SGLang sweep: the server here fails at once, the point is named and labelled."""
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--model", "M", "--chunk-budget", "512,-1", "--serve",
                                 "/bin/false --port {port} --chunked-prefill-size {chunk_budget}", "--serve-timeout",
                                 "5s", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 1 and "cannot read" not in result.output, result.output
    points = json.loads((out / "sweep.json").read_text())["points"]
    assert [(p["point"], p["label"], p["status"]) for p in points] == [("b512", "budget 512", "failed"),
                                                                       ("unchunked", "unchunked", "failed")]
    assert points[1]["serve_command"].endswith("--chunked-prefill-size -1")


def test_an_interrupted_sweep_says_so_in_the_terminal_report_and_exit_status(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The first point runs; Ctrl-C during the second, before it recorded anything; the third never runs."""
    real, calls = studies.invoke_run, []

    def invoke(args: list[str]) -> int:
        calls.append(args)
        if len(calls) == 1:
            return real(args)
        Path(args[args.index("--out") + 1]).mkdir(parents=True)
        return 130

    monkeypatch.setattr(studies, "invoke_run", invoke)
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--chunk-budget", "512,2048,none", *SIM, *SHORT, "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 130, result.output
    said = "Sweep interrupted (Ctrl-C or SIGTERM) during budget 2048: 1 of 3 points did not run (unchunked)."
    assert said in _flat(result.output) and len(calls) == 2
    assert said in _flat((out / "report.md").read_text())
    assert said in json.loads((out / "compare.json").read_text())["missing"]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["interrupted"] is True
    assert [p["status"] for p in manifest["points"]] == ["ok", "interrupted", "not run"]


def test_simulator_repeats_run_successive_seeds_and_are_compared(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--chunk-budget", "512", "--repeat", "2", *SIM, *SHORT, "--seed", "4",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 0, result.output
    seeds = [json.loads((out / "b512" / f"run{i}" / "run.json").read_text())["config"]["seed"] for i in (1, 2)]
    assert seeds == [4, 5]
    assert json.loads((out / "sweep.json").read_text())["points"][0]["seeds"] == [4, 5]
    assert (out / "compare.json").is_file()
    assert "Compared with --force" not in (out / "report.md").read_text()  # the seed is a setting the sweep varied


def test_a_simulated_sweep_says_what_it_simulates_once_and_each_point_only_its_result(tmp_path: Path) -> None:
    """Every point used to repeat the simulator's opening lines (the deployment, the accuracy paragraph); they print
    at the first point, the verdict keeps its own; a single run still prints them all."""
    accuracy = "published figures held out of the simulator's fit"  # the accuracy paragraph's first sentence
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--chunk-budget", "512,none", *SIM, *SHORT, "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert text.count("simulating llama-3.1-8b on a virtual clock") == 1
    assert text.count("H100 SXM: bfloat16 weights, K/V at 2 B an element") == 1
    assert text.count(accuracy) == 2 and "Simulated: H100 SXM" in text  # once at the start, once in the verdict
    assert text.index(accuracy) < text.index("sweep point 2/2")
    assert text.count(f"{out / 'unchunked'}: ") == 1  # the second point's own result line
    said: list[str] = []  # a single `itlbench run` (no sweep around it) says every line, as before
    assert said_once(said.append) == said.append
    with sim_intro_once():
        for line in ("a", "b", "a"):
            said_once(said.append)(line)
    assert said == ["a", "b"]
