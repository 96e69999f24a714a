"""The committed Grafana dashboards as data: their targets and Grafana's variable interpolation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from itlbench.telemetry.dashboards import BOARDS

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__all",
                     "__from", "__to", "__name", "__dashboard"}
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def dashboards() -> dict[str, dict[str, Any]]:
    return {name: json.loads((ROOT / "dashboards" / name).read_text()) for name in BOARDS}


def targets(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, target) of every panel query and every Prometheus annotation."""
    out = [(f"panel {p['id']} {p['title']!r}", t) for p in board["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']!r}", a) for a in board["annotations"]["list"] if "expr" in a]
    return out


def substitute(expr: str, prefix: str = "itlbench_", rate_interval: str = "20s", range_: str = "1h") -> str:
    """Grafana's interpolation as a user's default selection does it ('All' is .*; `range_` the time range)."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__range", range_).replace("${prefix}", prefix)
            .replace("$model_name", ".*").replace("$workload", ".*"))
