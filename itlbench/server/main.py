"""Server entry points: `serve(config)` (blocking), `start_server` (async), `BackgroundServer` (thread).

The same `ServerConfig` drives all three, so the CLI, `python -m itlbench.server`, in-process
embedding and tests start byte-identical servers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from itlbench.engine.async_engine import AsyncEngine
from itlbench.engine.config import POLICIES, EngineConfig, default_preset, parse_chunk_budget
from itlbench.engine.engine_process import EngineProcessClient
from itlbench.engine.threads import apply_torch_threads, serving_threads
from itlbench.server.app import ServerState, build_app
from itlbench.server.metrics import ServerMetrics

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

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


@dataclass
class RunningServer:
    """A started server: its URL, engine driver and runner (for `stop`)."""

    config: ServerConfig
    runner: web.AppRunner
    engine: AsyncEngine | EngineProcessClient
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    async def stop(self) -> None:
        await self.runner.cleanup()
        await asyncio.to_thread(self.engine.shutdown)


def build_engine(config: EngineConfig):  # noqa: ANN201 - Engine imports torch; keep the import lazy
    from itlbench.engine.engine import Engine

    return Engine(config)


async def start_server(config: ServerConfig, engine: object | None = None, *,
                       standalone: bool = False) -> RunningServer:
    """Build the engine (unless given), start its driver and listen; port 0 picks a free port.

    `standalone`: this process exists to serve (`itlbench serve`, `python -m itlbench.server`). Then
    the engine runs in its own process unless `engine_process=False`, and torch gets
    `serving_threads` threads. Embedded (tests, notebooks), the engine stays in this process, reachable
    as `server.engine.engine`, and torch's thread count is left alone unless `torch_threads` is set.
    """
    ecfg = config.engine
    metrics = ServerMetrics(config.model_name)
    in_process = engine is not None or not (ecfg.engine_process if ecfg.engine_process is not None else standalone)
    threads = serving_threads(ecfg.torch_threads) if standalone or ecfg.torch_threads is not None else None
    driver: AsyncEngine | EngineProcessClient
    if in_process:
        if engine is None:
            if threads is not None:
                apply_torch_threads(threads)
            engine = await asyncio.to_thread(build_engine, ecfg)
        view = engine
        metrics.set_config(engine)
        driver = AsyncEngine(engine, max_waiting=config.max_waiting, observer=metrics)
        driver.start()
        backend = getattr(getattr(engine, "runner", None), "backend", None)
        layout = {"engine_process": False, "torch_threads": _torch_threads(),
                  "decode_kernel": getattr(backend, "decode_kernel", getattr(backend, "name", None))}
    else:
        proc = EngineProcessClient(ecfg, threads or serving_threads(None), max_waiting=config.max_waiting,
                                   observer=metrics)
        await proc.start()
        assert proc.engine is not None
        view = proc.engine
        metrics.set_config(view)
        driver = proc
        layout = {"engine_process": True, "torch_threads": view.torch_threads, "decode_kernel": view.decode_kernel,
                  "engine_pid": view.pid}
    app = build_app(ServerState(driver, metrics, config.model_name, config.api_key, layout))  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=logging.getLogger("aiohttp.access") if config.access_log else None,
                           handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    server = RunningServer(config, runner, driver, port)
    _log_startup(server, view, layout)
    return server


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def _log_startup(server: RunningServer, engine: object, layout: dict[str, object]) -> None:
    cfg = server.config.engine
    budget = "none" if cfg.chunk_budget is None else cfg.chunk_budget
    log.info("itlbench serving model=%s device=%s dtype=%s chunk_budget=%s policy=%s%s engine_process=%s "
             "torch_threads=%s decode=%s url=%s", server.config.model_name, getattr(engine, "device", "?"),
             getattr(engine, "dtype", "?"), budget, cfg.policy, " mixed" if cfg.mixed else "",
             "yes" if layout["engine_process"] else "no", layout["torch_threads"], layout["decode_kernel"],
             server.base_url)


def serve(config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve_forever(config))


async def _serve_forever(config: ServerConfig) -> None:
    server = await start_server(config, standalone=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await server.stop()


class BackgroundServer:
    """A server on its own event-loop thread, for embedding in synchronous code and tests."""

    def __init__(self, config: ServerConfig, engine: object | None = None) -> None:
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


def parse_args(argv: Sequence[str] | None = None) -> ServerConfig:
    """Flags mirror `itlbench serve` and `bundled_server.server_args`."""
    p = argparse.ArgumentParser(prog="python -m itlbench.server", description=__doc__)
    p.add_argument("--model", default=None, help="preset name or local Hugging Face directory "
                   "(default: llama-3.2-1b on CUDA, cpu-small on CPU)")
    p.add_argument("--chunk-budget", default="2048", help="tokens per step, e.g. 2048, 8k, or none")
    p.add_argument("--policy", default="budget", choices=POLICIES)
    p.add_argument("--mixed", action="store_true", help="prefill-first only: decodes ride in prefill steps")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=None)
    p.add_argument("--kv-memory-gib", type=float, default=4.0)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine core in its own process (default: yes)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch intra-op threads (default: the cores available less one)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless told otherwise)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("ITLBENCH_API_KEY"), help="default: $ITLBENCH_API_KEY")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                   help="waiting requests beyond which new ones get 429")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    a = p.parse_args(argv)
    engine = EngineConfig(
        model=a.model or default_preset(a.device), chunk_budget=parse_chunk_budget(a.chunk_budget), policy=a.policy, mixed=a.mixed,
        max_num_seqs=a.max_num_seqs, block_size=a.block_size, kv_blocks=a.kv_blocks,
        kv_memory_gib=a.kv_memory_gib, max_model_len=a.max_model_len,
        enable_prefix_caching=not a.no_prefix_caching, device=a.device, dtype=a.dtype, seed=a.seed,
        engine_process=a.engine_process, torch_threads=a.torch_threads)
    return ServerConfig(engine=engine, host=a.host, port=a.port, api_key=a.api_key,
                        served_model_name=a.served_model_name, max_waiting=a.max_waiting,
                        access_log=a.access_log)
