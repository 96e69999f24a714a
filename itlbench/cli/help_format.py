"""How `--help` reads: flowing paragraphs, nothing cut to `…` and no type on a flag, at any terminal width.

typer 0.29 keeps the hard line breaks of a docstring's first paragraph in the command list and of every
later one in a command's `--help`; its options table cuts a flag name or a long word (a URL, an SLO
example) that does not fit its column, and gives a flag a type (`--json <bool>`) as if it took a value.
`FlowingTyper` fixes these for every command it registers, without a docstring written on one line: the
help is rejoined when the command is registered, and typer's table class is swapped for `HelpTable` when
help is drawn (not at import: typer reads TERMINAL_WIDTH then).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer
import typer.core
from rich.table import Table
from rich.text import Text

from itlbench.cli.menu import PANEL_OF, in_menu_order

Command = TypeVar("Command", bound=Callable[..., Any])


def flowing(doc: str | None) -> str | None:
    """A docstring with each paragraph on one line, so rich wraps it at the terminal's width.
    A paragraph starting with \\b stays as written, as click means it."""
    if not doc:
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
                       for p in paragraphs)


class HelpTable(Table):
    """typer's options table with nothing cut to `…`: a flag name or a word of help too long for its column
    folds onto the next line (typer's cut `--no-adaptive-warmup`, a URL or an SLO example at 80 columns,
    and `--unchunked-prefill-cap` in the CLI reference at 88)."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns:
            column.overflow = "fold"
        for cell in renderables:  # the help cell is a rich Columns of Texts, which keep their own overflow
            for item in getattr(cell, "renderables", ()):
                if isinstance(item, Text):
                    item.overflow = "fold"


def _folding_tables() -> None:
    """typer draws every --help table with rich_utils.Table: make it a HelpTable (imported here, lazily)."""
    from typer import rich_utils

    rich_utils.Table = HelpTable  # type: ignore[misc]


def _untyped_flags(command: click.Command, ctx: click.Context) -> None:
    """A flag takes no value: typer's type column ('--json <bool>', '--help <bool>') reads as one to give."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False):
            param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]


class HelpCommand(typer.core.TyperCommand):
    """A command whose --help is drawn with HelpTable, its flags without a type."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _folding_tables()
        _untyped_flags(self, ctx)
        super().format_help(ctx, formatter)


class HelpGroup(typer.core.TyperGroup):
    """The app's own --help (the command list), drawn with HelpTable, in the menu's order and panels."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return in_menu_order(super().list_commands(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _folding_tables()
        _untyped_flags(self, ctx)
        for name, command in self.commands.items():
            command.rich_help_panel = PANEL_OF.get(name, "Commands")  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)


class FlowingTyper(typer.Typer):
    """A typer app whose commands' help flows and is never cut (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=HelpGroup, **kwargs)

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[Command], Command]:
        register = super().command

        def decorator(func: Command) -> Command:
            help_text = kwargs.pop("help", None) or flowing(inspect.getdoc(func))
            return register(name, help=help_text, cls=kwargs.pop("cls", None) or HelpCommand, **kwargs)(func)

        return decorator
