"""User-facing errors: every one names the field at fault and how to fix it."""

from __future__ import annotations


class ItlbenchError(Exception):
    """Base for errors the CLI prints as one clear line instead of a traceback."""


class ConfigError(ItlbenchError, ValueError):
    """A configuration value is invalid; `field` names it, `fix` says what would work."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        # one line: a library's message quoted in `problem` (polars adds hints on further lines) keeps its first
        self.problem = problem = next((line for line in problem.splitlines() if line.strip()), problem).strip()
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


# `itlbench run`'s exit status when the run ended early (aborted after failures in a row, or its server died):
# its records, summary and report are written, so a sweep goes on to its next point
EXIT_ENDED_EARLY = 1
