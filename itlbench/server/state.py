"""What every handler of the server reads: its `ServerState`, stored on the aiohttp application.

Its own module so that the handler modules (`app`, `introspection`) reach it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from itlbench.server.guard import DEFAULT_BODY_TIMEOUT_S
from itlbench.server.metrics import ServerMetrics
from itlbench.serving.client import EngineClient

DEFAULT_MAX_BODY_MIB = 4  # a 128k-token prompt as JSON token ids is under 1 MiB


@dataclass
class ServerState:
    """What the handlers share: the engine driver, its metrics, and the public model name."""

    engine: EngineClient
    metrics: ServerMetrics
    model_name: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_MIB << 20
    tracing: Any = None  # telemetry.server_tracing.ServerTracing when --otlp-endpoint is given
    layout: dict[str, object] | None = None  # engine process or thread, torch threads, decode kernel
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # a body trickled slower than this gets 408


STATE: web.AppKey[ServerState] = web.AppKey("itlbench_state", ServerState)


def server_state(request: web.Request) -> ServerState:
    return request.app[STATE]
