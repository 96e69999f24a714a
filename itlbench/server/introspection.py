"""The endpoints that read the server rather than generate: /v1/models, /v1/engine, /v1/steps, /health, /metrics.

/health answers 503 with the one line that says why the engine is not alive (`EngineClient.why_not_alive`), the
line the server also exits with, so a supervisor reading either sees the same cause.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from itlbench.server.protocol import ApiError
from itlbench.server.state import ServerState, server_state
from itlbench.server.steps import install_steps, stream_steps


def install_introspection(app: web.Application) -> None:
    install_steps(app)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)  # a name may hold slashes (org/repo)
    app.router.add_get("/v1/steps", _steps)
    app.router.add_get("/v1/engine", _engine_info)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)


def _model_object(state: ServerState) -> dict[str, Any]:
    """The served model as OpenAI's model object (the one entry of /v1/models)."""
    engine = state.engine.engine
    return {"id": state.model_name, "object": "model", "created": 0, "owned_by": "itlbench",
            "root": engine.model_config.name, "max_model_len": engine.max_model_len}


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_object(server_state(request))]})


async def _model(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: the model object as OpenAI returns it, 404 (OpenAI's shape) for another name."""
    state = server_state(request)
    name = request.match_info["model"]
    if name != state.model_name:
        raise ApiError(404, f"model: {name!r} does not exist; this server serves {state.model_name!r}",
                       "model", "invalid_request_error", "model_not_found")
    return web.json_response(_model_object(state))


async def _health(request: web.Request) -> web.Response:
    engine = server_state(request).engine
    if engine.is_alive:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "error", "error": await engine.why_not_alive()}, status=503)


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = server_state(request).metrics.render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


async def _steps(request: web.Request) -> web.StreamResponse:
    return await stream_steps(request, server_state(request).engine)


def _config(config: Any, layout: dict[str, Any]) -> dict[str, Any]:
    """The engine's configuration, where it runs and on how many torch threads as resolved (null there means
    'the default'); the simulator has neither, on a thread of the server without torch."""
    out = config.as_dict()
    if out.get("engine") != "sim":
        out.update({k: layout[k] for k in ("engine_process", "torch_threads") if k in layout})
    return out


async def _engine_info(request: web.Request) -> web.Response:
    state = server_state(request)
    engine = state.engine.engine
    bm = engine.block_manager
    return web.json_response({
        "served_model_name": state.model_name,
        "engine": _config(engine.config, state.layout or {}),
        "model": dataclasses.asdict(engine.model_config),
        "device": str(engine.device), "dtype": str(engine.dtype),
        "max_model_len": engine.max_model_len,
        "kv_blocks": bm.num_blocks, "kv_free_blocks": bm.num_free_blocks, "kv_usage": bm.usage,
        "num_running": engine.num_running, "num_waiting": engine.num_waiting,
        "last_step": engine.step_log.last_step,
        "serving": state.layout or {},
    })
