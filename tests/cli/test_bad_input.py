"""Bad input a user types, as the command line meets it: one line naming the flag and the fix, exit 2, no
directory left behind (the fresh-eyes audit's findings, one test each)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from itlbench.cli import app

runner = CliRunner()
SIM = ["--engine", "sim", "--duration", "1s", "--no-live", "--no-report"]


def _lines(text: str) -> list[str]:
    return [s for s in text.splitlines() if s.strip()]


def test_a_trace_workload_without_a_trace_on_the_simulator_says_to_give_one(tmp_path: Path) -> None:
    """It said "no trace file at '.'": the missing flag read as the current directory."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *SIM, "--workload", "trace", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --trace: workload 'trace' needs a CSV "
                                     "(pass --trace path/to/AzureLLMInferenceTrace_conv.csv)"], result.output
    assert not out.exists()


def test_phases_lengths_past_the_bundled_context_are_refused_before_the_engine_starts(tmp_path: Path) -> None:
    """The simulator's context is known from its preset: it was started (and its intro printed) first."""
    out = tmp_path / "phases"
    result = runner.invoke(app, ["phases", "--engine", "sim", "--lengths", "200k", "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --lengths: no length fits the context (131072 tokens) and --max-prompt "
                                     "(give shorter lengths)"], result.output
    assert not out.exists()
