"""Server entry points: `serve(config)` (blocking), `start_server` (async), `BackgroundServer` (thread).

The same `ServerConfig` drives all three, so the CLI (`itlbench serve`), in-process
embedding and tests start byte-identical servers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from itlbench.core.engine import SteppedEngine
from itlbench.core.engine_config import EngineConfig
from itlbench.server.app import build_app
from itlbench.server.guard import ConnectionGuard, ConnectionLimits, GuardedSite, listen_error
from itlbench.server.metrics import ServerMetrics
from itlbench.server.state import DEFAULT_MAX_BODY_MIB, ServerState
from itlbench.serving.async_engine import AsyncEngine
from itlbench.serving.build import create_engine
from itlbench.serving.client import EngineClient, EngineDeadError
from itlbench.serving.process_client import EngineProcessClient
from itlbench.system.heap import freeze_heap
from itlbench.system.threads import apply_torch_threads, serving_threads

log = logging.getLogger("itlbench.server")

DEFAULT_MAX_WAITING = 1024


@dataclass
class ServerConfig:
    """Where to listen and what to serve; `served_model_name` defaults to the model preset name."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    access_log: bool = False
    max_body_mib: float = DEFAULT_MAX_BODY_MIB
    otlp_endpoint: str | None = None  # export SERVER spans and gen_ai.server.* metrics over OTLP/HTTP
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)  # slow clients (server/guard.py)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


@dataclass
class RunningServer:
    """A started server: its URL, engine driver and runner (for `stop`)."""

    config: ServerConfig
    runner: web.AppRunner
    engine: EngineClient
    port: int
    tracing: Any = None
    guard: ConnectionGuard | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    async def stop(self) -> None:
        await self.runner.cleanup()
        await asyncio.to_thread(self.engine.shutdown)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # export the last spans


async def start_server(config: ServerConfig, engine: SteppedEngine | None = None, *,
                       standalone: bool = False) -> RunningServer:
    """Build the engine (unless given), start its driver and listen; port 0 picks a free port.

    `standalone`: this process exists to serve (`itlbench serve`). Then
    the engine runs in its own process unless `engine_process=False`, and torch gets
    `serving_threads` threads. Embedded (tests, notebooks), the engine stays in this process, reachable
    as `server.engine.engine`, and torch's thread count is left alone unless `torch_threads` is set.
    """
    ecfg = config.engine
    metrics = ServerMetrics(config.model_name)
    tracing = _tracing(config)
    observer = metrics if tracing is None else tracing.observing(metrics)
    # the simulator computes nothing: it needs neither its own process nor torch threads
    sim = ecfg.engine == "sim"
    in_process = sim or engine is not None or not (
        ecfg.engine_process if ecfg.engine_process is not None else standalone)
    threads = None if sim else (
        serving_threads(ecfg.torch_threads) if standalone or ecfg.torch_threads is not None else None)
    driver: EngineClient
    if in_process:
        if engine is None:
            if threads is not None:
                apply_torch_threads(threads)
            engine = await asyncio.to_thread(create_engine, ecfg)
        view = engine
        metrics.set_config(engine)
        driver = AsyncEngine(engine, max_waiting=config.max_waiting, observer=observer)
        driver.start()
        info = engine.runner_info
        layout = {"engine_process": False, "torch_threads": None if sim else _torch_threads(),
                  "decode_kernel": info.decode_kernel, "weight_layout": info.weight_layout,
                  "warnings": list(info.warnings)}
    else:
        proc = EngineProcessClient(ecfg, threads or serving_threads(None), max_waiting=config.max_waiting,
                                   observer=observer)
        await proc.start()
        assert proc.engine is not None
        view = proc.engine
        metrics.set_config(view)
        driver = proc
        layout = {"engine_process": True, "torch_threads": view.torch_threads, "decode_kernel": view.decode_kernel,
                  "weight_layout": view.weight_layout, "warnings": list(view.warnings), "engine_pid": view.pid,
                  "engine_gc_frozen_objects": view.gc_frozen_objects}
    if standalone:  # this process only serves from here on: its startup heap stays put (itlbench/heap.py)
        layout["gc_frozen_objects"] = freeze_heap()
    app = build_app(ServerState(driver, metrics, config.model_name, config.api_key,
                                int(config.max_body_mib * 2**20), tracing=tracing, layout=layout,
                                body_timeout_s=config.limits.body_timeout_s))
    runner = web.AppRunner(app, access_log=logging.getLogger("aiohttp.access") if config.access_log else None,
                           handler_cancellation=True)
    await runner.setup()
    guard = ConnectionGuard(config.limits)
    try:
        await GuardedSite(runner, config.host, config.port, guard).start()
    except OSError as exc:  # taken since `check_listen` looked: the engine goes down with the server
        await runner.cleanup()
        await asyncio.to_thread(driver.shutdown)
        raise listen_error(config.host, config.port, exc) from None
    port = runner.addresses[0][1]
    server = RunningServer(config, runner, driver, port, tracing, guard)
    _log_startup(server, view, layout)
    return server


def _tracing(config: ServerConfig) -> Any:
    """OpenTelemetry for this server, only when an endpoint is given (nothing is imported otherwise)."""
    if not config.otlp_endpoint:
        return None
    from itlbench.server.tracing import ServerTracing
    from itlbench.telemetry.otel import check_endpoint

    return ServerTracing(check_endpoint(config.otlp_endpoint) or "", config.model_name)


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def _log_startup(server: RunningServer, engine: object, layout: dict[str, object]) -> None:
    cfg = server.config.engine
    if not server.config.api_key and server.config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who reaches this port can send load and read "
                    "/v1/steps; set ITLBENCH_API_KEY in its environment or bind 127.0.0.1", server.config.host)
    budget = "none" if cfg.chunk_budget is None else cfg.chunk_budget
    if cfg.engine == "sim":  # no engine process, no torch, no kernels: say what runs instead
        where = "simulated on a thread of the server (no engine process, no torch)"
    else:
        where = (f"engine_process={'yes' if layout['engine_process'] else 'no'} torch_threads={layout['torch_threads']} "
                 f"decode={layout['decode_kernel']} weights={layout['weight_layout']}")
    log.info("itlbench serving model=%s device=%s dtype=%s chunk_budget=%s policy=%s%s %s url=%s",
             server.config.model_name, getattr(engine, "device", "?"), getattr(engine, "dtype", "?"), budget,
             cfg.policy, " mixed" if cfg.mixed else "", where, server.base_url)
    for warning in layout.get("warnings") or ():  # also in GET /v1/engine (serving.warnings), so in run.json
        log.warning("%s", warning)


def serve(config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve_forever(config))


PORT_FILE_ENV = "ITLBENCH_PORT_FILE"  # set by the parent (harness.bundled_server): where to say the bound port


def report_port(port: int, path: str | None = None) -> None:
    """Tell the parent which port this server bound (JSON {port, pid}, written atomically), so it
    never has to guess a free port in advance and then trust whatever answers there."""
    path = path or os.environ.get(PORT_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"port": port, "pid": os.getpid()}, f)
    os.replace(tmp, path)


async def _serve_forever(config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, or until the engine dies under the server (its process, or the loop that
    drives it in this process): then requests in flight have already failed, and the server stops and raises
    the error that says how it died."""
    server = await start_server(config, standalone=True)
    report_port(server.port)
    stop = asyncio.Event()
    engine = server.engine
    process = engine if isinstance(engine, EngineProcessClient) else None

    def on_signal() -> None:
        stop.set()
        if process is not None:
            process.draining()  # a group signal reached the engine too: it keeps serving the drain

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(engine.wait_dead())]
    died: str | None = None
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        # decided now: a signal during the stop below masks nothing; in the words /health said meanwhile
        died = None if stop.is_set() else await engine.why_not_alive()
    finally:
        for task in waits:
            task.cancel()
        log.info("shutting down")
        await server.stop()
    if died is not None:
        raise EngineDeadError(f"{died}; the server stopped")


class BackgroundServer:
    """A server on its own event-loop thread, for embedding in synchronous code and tests."""

    def __init__(self, config: ServerConfig, engine: SteppedEngine | None = None) -> None:
        self.config = config
        self._engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="itlbench-server", daemon=True)
        self.server: RunningServer | None = None

    def start(self, timeout: float = 300.0) -> BackgroundServer:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(start_server(self.config, self._engine), self._loop)
        self.server = fut.result(timeout)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def stop(self, timeout: float = 30.0) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout)
            self.server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
