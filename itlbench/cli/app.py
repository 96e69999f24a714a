"""The `itlbench` typer app and what every command shares: the error console and one way to fail."""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from itlbench.cli.engine_options import ENGINE_FIELDS, flag_of
from itlbench.cli.help_format import FlowingTyper
from itlbench.errors import EXIT_ENDED_EARLY, ConfigError

app = FlowingTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                   help="Measure what long prompts do to streaming LLM latency: TTFT by prompt bucket, "
                        "ITL tails, stalls and their cause, prefill:decode split.")
# emoji=False: a user's text such as `fixed:a:b` must print as typed, not as rich's `:a:` emoji
console = Console(stderr=True, emoji=False)


def stdout_console() -> Console:
    """A console for tables on stdout that prints user text as typed (no emoji codes)."""
    return Console(emoji=False)


def fail(exc: Exception) -> NoReturn:
    """One line naming the flag or field and the fix, exit 2 (never a traceback)."""
    if isinstance(exc, ConfigError) and exc.field in ENGINE_FIELDS:
        exc = ConfigError(flag_of(exc.field), exc.problem, exc.fix)
    console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # one line, at any width
    raise typer.Exit(2)


def finite(value: object) -> object:
    """JSON has no infinity: a ridge never reached becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


AsJson = Annotated[bool, typer.Option("--json", help="Print the figures of the table(s) as JSON on stdout (each "
                                            "key names its unit: _s, _ms, _bytes), instead of the tables.")]


def print_json(doc: Any) -> None:
    """`--json`: the document the tables are drawn from, on stdout, parseable (infinities as null)."""
    json.dump(finite(doc), sys.stdout, indent=2, default=str)
    print()


def write_report(run_dir: object) -> None:
    """The run's HTML report; a failure to draw it is a warning, never a lost run."""
    from pathlib import Path

    from itlbench.report.run_report import write_run_report_safely

    html, problem = write_run_report_safely(Path(str(run_dir)))
    if html is not None:
        console.print(f"[bold]Report[/] {html}", highlight=False)
    else:
        console.print(f"[yellow]warning:[/] no report written ({problem}); the records are complete: retry "
                      f"with `itlbench report {run_dir}` (--out DIR where it cannot be written)", highlight=False)


SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}  # the shell's 128 + signal number, as an unhandled signal would give


def ended_early_code(run_dir: object) -> int:
    """A finished run's exit status: 1 when it was aborted (failures in a row) or its server died; 130 when
    interrupted by Ctrl-C/SIGINT (or an unknown signal), 143 by SIGTERM, so a script or job runner sees the
    signal; else 0. Its records and summary are kept either way."""
    from pathlib import Path

    from itlbench.report.data import read_json

    doc = read_json(Path(str(run_dir)) / "run.json") or {}
    if doc.get("interrupted") or doc.get("stop_reason") == "interrupted":
        return SIGNAL_EXIT.get(str(doc.get("signal")), 130)
    return EXIT_ENDED_EARLY if doc.get("aborted_reason") or doc.get("server_exit_code") is not None else 0
