"""The CLI reference page, rendered from the typer app so it cannot drift from the code.

mkdocs runs this file as a hook (`hooks:` in mkdocs.yml): `on_files` adds a generated `cli.md`
holding every command's `--help`, exactly as `itlbench <command> --help` prints it. Nothing is
written into `docs/`, so there is no hand-kept copy to go stale. `python docs/gen_cli.py` prints
the same page, for a look without building the site.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "cli.md"
WIDTH = 88  # columns the help is rendered at: fits the page; narrower, long flag names fold onto two lines

INTRO = """# CLI reference

Every command's `--help`, generated from the `itlbench` command line itself (`itlbench.cli.app`)
each time the site is built (`docs/gen_cli.py`); edit the help texts in `itlbench/cli/`, not here.
Engine options (`--chunk-budget`, `--policy`, `--attention`, …) are the fields of `EngineConfig`
under the same names, so `run`, `serve` and `phases` spell them alike. `itlbench sweep` passes every
option it does not know to `itlbench run`.
"""


def command_names() -> list[str]:
    """The subcommands in the order `itlbench --help` lists them (`itlbench/cli/menu.py`)."""
    import typer.main

    from itlbench.cli import app
    from itlbench.cli.menu import in_menu_order

    return in_menu_order(list(typer.main.get_command(app).commands))  # type: ignore[attr-defined]


def help_text(args: list[str]) -> str:
    """What `itlbench ARGS --help` prints at WIDTH columns, without colour or trailing blanks."""
    from typer.testing import CliRunner

    from itlbench.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], prog_name="itlbench",
                                env={"TERMINAL_WIDTH": str(WIDTH), "NO_COLOR": "1"})
    if result.exit_code != 0:
        raise RuntimeError(f"itlbench {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    lines = [line.rstrip() for line in result.output.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def render() -> str:
    """The whole page: the app's own help, then one section per command."""
    parts = [INTRO]
    for name in ["", *command_names()]:
        title = f"itlbench {name}".strip()
        parts += [f"## {title}", "", '<div class="cli-help" markdown>', "", "```text",
                  help_text([name] if name else []), "```", "", "</div>", ""]
    return "\n".join(parts)


def on_files(files, config):  # noqa: ANN001, ANN201 - mkdocs hook signature
    """mkdocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the checkout's package, even where another copy is installed
    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(render())
