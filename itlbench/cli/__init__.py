"""`itlbench` command line: one module per group of commands, all on one typer app."""

from itlbench.cli import models, results, run, selftest, serve, studies  # noqa: F401 - each registers its commands
from itlbench.cli.app import app

__all__ = ["app"]


def main() -> None:  # pragma: no cover - console entry
    app()
