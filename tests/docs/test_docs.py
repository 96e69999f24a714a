"""The docs site builds cleanly and the commands the docs show are ones the CLI accepts.

`mkdocs build --strict` fails on a broken link, a page missing from the nav or a hook error, and its
CLI reference is rendered from the typer app. The command check reads every `itlbench …` line of the
README's and the docs pages' code (blocks and inline spans) and holds each subcommand and each
`--flag` against the app's own options, so a renamed or removed flag fails here instead of in a
reader's terminal. Measured-performance pages (docs/perf/) quote the commands as they were run and
are exempt; instead each of their tables must carry its date, commit, machine and command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from itlbench.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
WRAPPERS = {"exec", "nohup", "time", "nsys", "setsid", "flock", "timeout", "taskset", "nice"}  # run a program named later
# other servers' flags, named where the docs say how to start them: vLLM's, llama.cpp's
FOREIGN_FLAGS = {"--enable-prompt-tokens-details", "--otlp-traces-endpoint", "--kv-unified"}
CI_TEST_COMMAND = 'pip install -e ".[test]" && python3 -m pytest -q'


@dataclass(frozen=True)
class Command:
    """One `itlbench …` invocation found in a page, with where it was found."""

    page: str
    text: str
    subcommand: str
    flags: tuple[str, ...]


def command_pages() -> list[Path]:
    """The README and every docs page except the historical records under docs/perf/."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if "perf" not in p.relative_to(ROOT).parts]


def code_lines(text: str) -> list[str]:
    """Lines of fenced code blocks (continuations joined) and inline code spans outside them."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += INLINE.findall(FENCE.sub("", text))
    return lines


def commands_in(page: Path, root: Path = ROOT) -> list[Command]:
    """Every `itlbench SUBCOMMAND …` in the page's code, with the `--flags` it passes."""
    found = []
    for line in code_lines(page.read_text()):
        for segment in re.split(r"&&|\|\||;|\|(?!\S*\])", line):
            try:
                tokens = shlex.split(segment, comments=True)
            except ValueError:  # an unbalanced quote in prose-like code: not a command line
                continue
            words = [t for t in tokens if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", t)]  # drop VAR=value
            if not words or "itlbench" not in words:
                continue
            if words[0] != "itlbench" and words[0] not in WRAPPERS:
                continue  # `ruff check itlbench tests`: itlbench is an argument there, not the program
            args = words[words.index("itlbench") + 1:]
            if not args or args[0].startswith(("<", "-")):
                continue  # `itlbench <command> --help`, `itlbench --help`: a placeholder, not a command
            flags = tuple(t.strip("[]").split("=")[0] for t in args[1:] if t.strip("[").startswith("--"))
            found.append(Command(str(page.relative_to(root)), segment.strip(), args[0], flags))
    return found


def cli_options() -> dict[str, set[str]]:
    """Each subcommand's flags, from the click command typer builds (secondary `--no-…` forms too)."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    options = {name: {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
               for name, cmd in commands.items()}
    options["sweep"] |= options["run"]  # sweep hands every option it does not know to `itlbench run`
    options["capacity"] |= options["run"]  # so does capacity
    return options


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail('mkdocs is missing: pip install -e ".[docs]" (the test extra includes it)')
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stderr, out.stderr
    reference = (tmp_path / "site" / "cli" / "index.html").read_text()
    for name in cli_options():
        assert f"itlbench {name}" in reference, f"the CLI reference has no section for `itlbench {name}`"
    assert "--chunk-budget" in reference and "Usage: itlbench run" in reference


def test_the_cli_reference_is_drawn_at_its_width_with_nothing_cut() -> None:
    """docs/gen_cli.py draws every --help at WIDTH columns (typer reads TERMINAL_WIDTH when its help module
    is first imported: the app must not import it early), each flag and word whole (folded, never `…`)."""
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_cli.py")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    boxes = {len(line) for line in out.stdout.splitlines() if line.startswith("╭")}
    assert boxes == {88}, boxes
    assert "--unchunked-prefill-…" not in out.stdout and "http://127.0.0.1:4318…" not in out.stdout


def test_every_documented_command_is_one_the_cli_accepts() -> None:
    options = cli_options()
    commands = [c for page in command_pages() for c in commands_in(page)]
    assert len(commands) >= 30, f"expected the pages' itlbench commands, found {len(commands)}"
    assert {c.page for c in commands} >= {"README.md", "docs/getting-started.md"}
    problems = []
    for c in commands:
        if c.subcommand not in options:
            problems.append(f"{c.page}: `{c.text}`: no command `{c.subcommand}`")
            continue
        problems += [f"{c.page}: `{c.text}`: `itlbench {c.subcommand}` has no {flag}"
                     for flag in c.flags if flag not in options[c.subcommand]]
    assert not problems, "\n".join(problems)
    runner = CliRunner()
    for name in sorted({c.subcommand for c in commands}):
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, f"itlbench {name} --help: {result.output}"


def test_every_option_in_the_reference_says_what_it_does() -> None:
    """The generated CLI reference is only as good as the help texts: none may be empty."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    missing = {name: [p.opts[0] for p in cmd.params if not getattr(p, "help", None)] for name, cmd in commands.items()}
    assert not {k: v for k, v in missing.items() if v}, f"options without help: {missing}"
    for name in ("run", "serve", "phases"):
        key = next(p for p in commands[name].params if p.name == "api_key")
        assert key.envvar == "ITLBENCH_API_KEY", f"itlbench {name} --api-key does not read ITLBENCH_API_KEY"


def test_every_flag_named_in_prose_exists() -> None:
    """An inline span that starts with a flag (`--torch-threads N`) names an itlbench flag."""
    known = set().union(*cli_options().values())
    problems = []
    for page in command_pages():
        for span in INLINE.findall(FENCE.sub("", page.read_text())):
            if not span.startswith("--"):
                continue
            problems += [f"{page.relative_to(ROOT)}: `{span}`: no itlbench command has {flag}"
                         for flag in re.findall(r"(?:^|[\s\[/|])(--[a-z][a-z0-9-]*)", span)
                         if flag not in known and flag not in FOREIGN_FLAGS]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_flag_the_cli_does_not_have(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```bash\nitlbench run --workload rag \\\n  --chunk-budgett 512   # typo\n```\n"
                    "Then `itlbench sweep --chunk-budget 512,none [--inject 32k]`, or `itlbench <command> --help`.\n")
    commands = commands_in(page, tmp_path)
    assert [(c.subcommand, c.flags) for c in commands] == [("run", ("--workload", "--chunk-budgett")),
                                                          ("sweep", ("--chunk-budget", "--inject"))]
    options = cli_options()
    assert "--chunk-budgett" not in options["run"] and "--inject" in options["sweep"]


def test_the_quick_start_is_the_two_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1]
    block = FENCE.search(quick)
    assert block, "the README's quick start has no code block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert lines == ['pip install -e ".[cpu]" && itlbench run --workload rag --inject 32k', CI_TEST_COMMAND]
    assert CI_TEST_COMMAND.removeprefix("pip ") in (ROOT / ".ci" / "run").read_text()


def test_readme_links_point_at_files_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t}
    missing = sorted(t for t in targets if t and not (ROOT / t).exists())
    assert not missing, f"README links to files that do not exist: {missing}"
    assert len(readme.splitlines()) <= 150


def test_every_measured_table_says_when_where_and_how() -> None:
    for page in sorted((DOCS / "perf").glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        counts = {key: len(re.findall(rf"^\| {key} \|", text, re.M)) for key in ("date", "commit", "machine", "command")}
        assert counts["date"] >= 1 and len(set(counts.values())) == 1, f"{page.name}: provenance rows {counts}"


def test_no_page_puts_an_api_key_on_a_command_line() -> None:
    """A key given as `--api-key VALUE` is readable by every user in `ps` and stays in shell history;
    the docs show ITLBENCH_API_KEY in the environment instead (docs/security.md, "The API key")."""
    shown = [f"{page.relative_to(ROOT)}: {line.strip()}" for page in command_pages()
             for line in code_lines(page.read_text()) if re.search(r"--api-key[ =]\S", line)]
    assert not shown, "\n".join(shown)
