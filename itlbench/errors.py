"""User-facing errors: every one names the field at fault and how to fix it."""

from __future__ import annotations


class ItlbenchError(Exception):
    """Base for errors the CLI prints as one clear line instead of a traceback."""


class ConfigError(ItlbenchError, ValueError):
    """A configuration value is invalid; `field` names it, `fix` says what would work."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)
