"""`itlbench --help` lists what a user runs first, first, and every command sits in one panel."""

from __future__ import annotations

from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.cli.menu import MENU, PANEL_OF


def _registered() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_is_in_the_menu_once() -> None:
    named = [n for _, names in MENU for n in names]
    assert len(named) == len(set(named))
    assert set(named) == _registered()


def test_help_lists_run_first_under_its_panel() -> None:
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"}).output
    assert out.index("Measure") < out.index(" run ") < out.index(" workloads ")
    for panel in {p for p in PANEL_OF.values()}:
        assert panel in out
    assert "Commands" not in out.split("Options")[-1]  # no command left in typer's default panel
