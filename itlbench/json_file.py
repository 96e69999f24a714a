"""A JSON object read from a file the user named (a config.json, a --gpu profile): every way it fails to read is
one ConfigError naming the flag, the file and the fix, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from itlbench.errors import ConfigError


def read_json_object(path: Path, fix: str, flag: str = "model") -> dict[str, Any]:
    """The JSON object in `path`, or a ConfigError naming `flag` and the file (not JSON, not UTF-8, nested past
    the parser's stack, or not an object)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(flag, f"{path} is not valid JSON: {exc}", fix) from None
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path} is not UTF-8 text", fix) from None
    except RecursionError:
        raise ConfigError(flag, f"{path} is nested too deeply to read", fix) from None
    if not isinstance(raw, dict):
        raise ConfigError(flag, f"{path} does not hold a JSON object", fix)
    return raw
