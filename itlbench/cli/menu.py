"""The order and panels of `itlbench --help`: what a user runs first comes first.

Commands register in import order (models, results, run, ...), which put `workloads` and `export-model`
above `run`. The menu is kept here, in one place, rather than as a `rich_help_panel` on each command."""

from __future__ import annotations

MENU: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Measure", ("run", "sweep", "capacity", "phases")),
    ("Read results", ("report", "compare", "analyze")),
    ("Serve", ("serve", "locust-worker")),
    ("Model the hardware", ("roofline", "calibrate")),
    ("Set up", ("workloads", "export-model", "selftest")),
)

PANEL_OF: dict[str, str] = {name: panel for panel, names in MENU for name in names}
ORDER: dict[str, int] = {name: i for i, name in enumerate(n for _, names in MENU for n in names)}


def in_menu_order(names: list[str]) -> list[str]:
    """The commands in the menu's order; any the menu does not name keep their order, after it."""
    return sorted(names, key=lambda name: ORDER.get(name, len(ORDER)))
