"""The `--inject` grammar: when to send long prompts into an otherwise steady load.

One spec is ``[Nx]LENGTH[@T1,T2,...][/PERIOD]``; several are separated by ``;`` (or given as
repeated flags).

- LENGTH: prompt tokens, a plain integer (``5000``) or with ``k`` = 1024 (``32k`` = 32,768,
  ``1.5k``), as everywhere in itlbench (`itlbench.units`).
- ``@T1,T2``: send at each listed time (``20s``, ``20``, ``500ms``, ``2m``; bare = seconds).
  Without ``@`` the single send time is the default the caller gives.
- ``Nx``: N copies sent together at *each* time: ``2x16k@10s,40s`` sends four prompts,
  two at 10 s and two at 40 s.
- ``/PERIOD``: repeat every PERIOD until the run ends, starting at the ``@`` time (at most one)
  or else half a period in: ``32k/30s`` sends at 15, 45, 75 s, ..., so a D-second run gets
  about D/PERIOD prompts, each in the middle of its own PERIOD. A period longer than the run
  is refused (`build._check_injections`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from itlbench.errors import ConfigError
from itlbench.units import parse_duration_s, parse_tokens

EXAMPLES = "examples: 32k, 32k@20s, 2x16k@10s,40s, 32k/30s"

_SPEC = re.compile(
    r"^(?:(?P<count>\d+)\s*x\s*)?(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<k>k)?"
    r"\s*(?:@(?P<at>[^/]+))?\s*(?:/(?P<every>.+))?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Injection:
    """One parsed spec: `count` prompts of `tokens` tokens at each of `at_s`, repeated every
    `every_s` seconds when set (then `at_s` holds the single start time)."""

    tokens: int
    count: int
    at_s: tuple[float, ...]
    every_s: float | None = None
    spec: str = ""


def _bad(piece: str, why: str = "") -> ConfigError:
    problem = f"cannot read '{piece}'" + (f": {why}" if why else "")
    return ConfigError("--inject", problem, EXAMPLES)


def _time(piece: str, text: str) -> float:
    try:
        return parse_duration_s(text, "--inject")
    except ConfigError:
        raise _bad(piece, f"'{text.strip()}' is not a time like 20s or 500ms") from None


def _tokens(piece: str, num: str, k: str | None) -> int:
    try:
        return parse_tokens(num + (k or ""), "--inject")
    except ConfigError:
        raise _bad(piece, "the length must be a whole number of tokens >= 1") from None


def parse_one(piece: str, default_at_s: float) -> Injection:
    """Parse a single spec (no `;`)."""
    match = _SPEC.match(piece.strip())
    if not match:
        raise _bad(piece)
    count = int(match["count"]) if match["count"] else 1
    if count < 1:
        raise _bad(piece, "the count must be >= 1")
    every = _time(piece, match["every"]) if match["every"] else None
    if every is not None and every <= 0:
        raise _bad(piece, "the period must be > 0")
    at = tuple(_time(piece, t) for t in match["at"].split(",")) if match["at"] else (_default_start(every, default_at_s),)
    if every is not None and len(at) > 1:
        raise _bad(piece, "a repeating spec takes one start time")
    return Injection(_tokens(piece, match["num"], match["k"]), count, at, every, piece.strip())


def _default_start(every_s: float | None, default_at_s: float) -> float:
    """A one-off spec goes at the caller's default time; a periodic one half a period in, so that
    "every P" over D seconds sends about D/P prompts rather than starting half-way through the run."""
    return float(default_at_s) if every_s is None else every_s / 2


def _pieces(text: str | Iterable[str] | None) -> list[str]:
    if text is None:
        return []
    texts = [text] if isinstance(text, str) else list(text)
    return [p.strip() for t in texts for p in t.split(";") if p.strip()]


def parse_injections(text: str | Iterable[str] | None, default_at_s: float) -> list[Injection]:
    """Parse `--inject` values (one string, or one per repeated flag); None/empty = none."""
    return [parse_one(piece, default_at_s) for piece in _pieces(text)]


def _starts(inj: Injection, duration_s: float) -> list[float]:
    if inj.every_s is None:
        return [t for t in inj.at_s if t < duration_s]
    start = inj.at_s[0]
    n = max(0, math.ceil((duration_s - start) / inj.every_s))
    return [t for t in (start + k * inj.every_s for k in range(n)) if t < duration_s]


def planned_count(injections: Iterable[Injection], duration_s: float) -> int:
    """How many prompts `injection_times` would list, counted without listing them (a typo such as
    100000000x1k built a list of that many before anything was said)."""
    total = 0
    for inj in injections:
        if inj.every_s is None:
            starts = sum(1 for t in inj.at_s if t < duration_s)
        else:
            starts = max(0, math.ceil((duration_s - inj.at_s[0]) / inj.every_s))
        total += starts * inj.count
    return total


def injection_times(injections: Iterable[Injection], duration_s: float) -> list[tuple[float, int]]:
    """The exact schedule: (send time, tokens) for every prompt before `duration_s`, in time order
    (ties keep spec order)."""
    schedule = [(t, inj.tokens) for inj in injections
                for t in _starts(inj, duration_s) for _ in range(inj.count)]
    return sorted(schedule, key=lambda item: item[0])
