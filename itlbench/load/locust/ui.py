"""Locust's own surfaces beside the master: its web UI and its request statistics (for reference only:
itlbench's figures come from its own records)."""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust.env import Environment


def start_web_ui(env: Environment, port: int) -> str:
    """Locust's web UI on loopback (port 0: a free one); returns its URL once it listens."""
    ui = env.create_web_ui("127.0.0.1", port)
    deadline = time.monotonic() + 10
    while ui.server is None or not ui.server.started:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Locust's web UI did not start on port {port}")
        gevent.sleep(0.02)
    return f"http://127.0.0.1:{ui.server.server_port}"


def locust_stats(env: Environment) -> list[dict[str, Any]]:
    """Locust's own view (POST = time to response headers, TTFT and E2E per class), for reference."""
    out = []
    for entry in env.stats.entries.values():
        if not entry.num_requests:
            continue
        out.append({"type": entry.method, "name": entry.name, "requests": entry.num_requests,
                    "failures": entry.num_failures, "median_ms": entry.median_response_time,
                    "p95_ms": entry.get_response_time_percentile(0.95),
                    "p99_ms": entry.get_response_time_percentile(0.99), "max_ms": entry.max_response_time})
    return out
