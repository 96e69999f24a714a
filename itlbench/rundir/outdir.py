"""Output directories the user names (`--out`, `DIR`): made up front, and a place that cannot be made is the
one-line error naming the flag, not a traceback after minutes of measuring."""

from __future__ import annotations

from pathlib import Path

from itlbench.errors import ConfigError


def make_dir(path: Path, flag: str = "--out") -> None:
    """`mkdir -p path`, or a ConfigError naming `flag` (under a file, a read-only or pseudo file system, ...)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(flag, f"cannot create {path}: {exc.strerror or exc}",
                          "name a directory this user can write") from None
