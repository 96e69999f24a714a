"""How much a server may make the client hold: caps on what it reads from an untrusted peer.

A server that never ends an SSE event, sends an endless response head, a control reply (`/models`,
`/engine`, a probe) of gigabytes or a `/metrics` body without end would otherwise grow the client's
memory until the run dies. Each cap fails only what exceeded it, with its own error kind:

    event    an SSE event (ended or not)    request row, error_kind "event_too_large"
    head     a streaming response's head    request row, error_kind "head_too_large"
    control  a control reply                a one-line error naming the URL ("reply_too_large")
    metrics  one /metrics body              scrapes row, error "body_too_large: ..."

`--limits event=8MiB,metrics=256MiB` changes some; the others keep their defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from itlbench.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


@dataclass(frozen=True)
class Limits:
    event_bytes: int = 4 << 20
    head_bytes: int = 64 << 10
    control_bytes: int = 8 << 20
    metrics_bytes: int = 64 << 20

    @classmethod
    def parse(cls, text: str | None) -> Limits:
        """`name=SIZE,...` (names: event, head, control, metrics; sizes like 4MiB, 65536, 64KiB)."""
        out = cls()
        if not text:
            return out
        names = {f.name.removesuffix("_bytes") for f in fields(cls)}
        given: set[str] = set()
        for item in text.split(","):
            name, sep, size = item.strip().partition("=")
            if not sep or name not in names:
                raise ConfigError("--limits", f"{item.strip()!r} is not NAME=SIZE with NAME one of "
                                  f"{', '.join(sorted(names))}", "e.g. --limits event=8MiB,metrics=256MiB")
            if name in given:  # which one was meant, the first or the last, only the user knows
                raise ConfigError("--limits", f"{name} is given twice", f"give {name}=SIZE once")
            given.add(name)
            out = replace(out, **{f"{name}_bytes": parse_size(size, "--limits")})
        return out


def parse_size(text: str, flag: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or int(m.group(1)) * _UNITS[unit] < 1024:
        raise ConfigError(flag, f"{text!r} is not a size of at least 1 KiB", "e.g. 4MiB, 64KiB or 65536")
    return int(m.group(1)) * _UNITS[unit]
