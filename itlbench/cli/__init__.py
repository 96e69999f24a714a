"""`itlbench` command line: one module per group of commands, all on one typer app."""

from itlbench.cli import models, results, run, selftest, serve, studies  # noqa: F401 - each registers its commands
from itlbench.cli.app import app
from itlbench.cli.streams import protect_std_streams

__all__ = ["app", "main"]


def main(prog_name: str | None = None) -> None:
    """The console entry: a reader that closes the pipe early cannot end a command before its files are written."""
    protect_std_streams()
    app(prog_name=prog_name)
