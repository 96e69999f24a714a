"""The one grammar for token counts and durations typed by users or printed back to them.

`k` always means 1024 tokens — in `--inject 32k`, `--chunk-budget 2k`, bucket labels (`le32k` =
≤32,768) and printed figures — because context lengths are spoken of in binary thousands (a "32k
context" holds 32,768 tokens), so `--inject 32k` lands in the `le32k` bucket a reader expects.
Durations: `150ms`, `20s`, `2m`, `2h`, `500us`, or parts added up largest first (`1m30s`, `1h30m`);
a bare number is seconds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from itlbench.errors import ConfigError

K = 1024  # tokens

_TOKENS = re.compile(r"^(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<k>k)?$", re.IGNORECASE)
_NUM = r"(?:\d+(?:\.\d+)?|\.\d+)"
_BARE = re.compile(rf"^{_NUM}$")
_PARTS = re.compile(rf"^(?:{_NUM}\s*(?:us|ms|h|m|s)\s*)+$", re.IGNORECASE)
_PART = re.compile(rf"({_NUM})\s*(us|ms|h|m|s)", re.IGNORECASE)
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

TOKENS_HELP = "a token count such as 2048 or 32k (k = 1024 tokens)"
DURATION_HELP = "a duration such as 20s, 150ms, 2m, 1m30s or 2h (a bare number is seconds)"


def parse_tokens(text: str | int, flag: str, fix: str = TOKENS_HELP) -> int:
    """A whole positive token count: `32k` = 32,768, `1.5k` = 1,536, `2048`."""
    if isinstance(text, int) and not isinstance(text, bool):
        value: float = text
    else:
        match = _TOKENS.match(str(text).strip())
        if not match:
            raise ConfigError(flag, f"cannot read {str(text)!r} as a token count", fix)
        value = float(match["num"]) * (K if match["k"] else 1)
    if value < 1 or not math.isclose(value, round(value)):
        raise ConfigError(flag, f"{text!r} is not a whole number of tokens >= 1", fix)
    return int(round(value))


def parse_duration_s(text: str | float, flag: str, fix: str = DURATION_HELP) -> float:
    """Seconds from `150ms`, `20s`, `2m`, `500us` or a bare number of seconds (never negative)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        value = _duration_text(str(text).strip(), flag, fix)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(flag, f"must be a duration >= 0, got {text!r}", fix)
    return value


def _duration_text(text: str, flag: str, fix: str) -> float:
    """Seconds from a bare number or unit parts (`1m30s`), each unit at most once, largest first."""
    if _BARE.match(text):
        return float(text)
    parts = _PART.findall(text) if _PARTS.match(text) else []
    units = [unit.lower() for _, unit in parts]
    if not parts or units != sorted(set(units), key=lambda u: -_SECONDS[u]):
        raise ConfigError(flag, f"cannot read {text!r} as a duration", fix)
    return sum(float(num) * _SECONDS[unit.lower()] for num, unit in parts)


def format_tokens(n: int) -> str:
    """`32k` for multiples of 1024 from 1024 up, else the plain count with thousands separators."""
    if n >= K and n % K == 0:
        return f"{n // K}k"
    return f"{n:,}"


def check_finite(config: object, name_of: Callable[[str], str] = lambda name: name) -> None:
    """Refuse nan or inf in any float field of a dataclass `config`, before anything uses it: a
    comparison with nan is always False, so range checks pass it, and JSON cannot hold either."""
    for spec in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, spec.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(name_of(spec.name), f"must be a finite number, got {value}",
                              "give a finite number")
