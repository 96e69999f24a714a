"""`itlbench phases`: bad input leaves no directory behind (not even the bundled server's log)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from itlbench.cli import app

runner = CliRunner()


def test_lengths_the_context_cannot_hold_exit_2_and_leave_no_directory(tmp_path: Path) -> None:
    """tiny's context is 4,096 tokens: an 8k prompt cannot be measured, found once its server answered."""
    out = tmp_path / "ph"
    result = runner.invoke(app, ["phases", "--model", "tiny", "--lengths", "8k", "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "error: --lengths: no length fits the context (4096 tokens)" in result.output
    assert not out.exists(), sorted(p.name for p in out.iterdir())
