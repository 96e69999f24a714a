"""The front end of an engine process: `EngineProcessClient`, the `EngineClient` beside an engine core
in its own process (`itlbench.serving.engine_core`).

In one process, the engine thread and the aiohttp loop that writes every token share one interpreter
and, on a small box, the cores that torch's threads also want. Here the front end mirrors the step
log and the engine's state (`EngineView`), feeds the metrics observer and fans outputs out to request
streams, and never imports torch. Wire format: `itlbench.serving.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.request import RequestOutput, SamplingParams
from itlbench.core.steps import StepLog, StepRecord
from itlbench.core.tokenizer import load_tokenizer
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.serving.client import (
    SHUT_DOWN,
    EngineDeadError,
    EngineObserver,
    QueueFullError,
    RequestStream,
    StepWaiters,
    engine_stopped,
    generate,
)
from itlbench.serving.wire import error_from, frame, read_frame
from itlbench.system.malloc import env_with_malloc_tunables

log = logging.getLogger("itlbench.engine.process")

_LAST_WORDS_S = 1.0  # how long a request waits, once the engine process has exited, for what it said before


def describe_exit(pid: int | None, code: int | None) -> str:
    """How an engine process ended, in the words of /health and the server's exit line: the signal by name."""
    who = f"the engine process (pid {pid})"
    if code is None:
        return f"{who} closed its connection"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{who} was killed by {name}"
    return f"{who} exited with code {code}"


@dataclass
class RequestTimes:
    """What the metrics need of a request the front end cannot see: its engine-side time stamps."""

    request_id: str
    arrival_ns: int
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None


class _BlockView:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_free_blocks = num_blocks

    @property
    def usage(self) -> float:
        return (self.num_blocks - self.num_free_blocks) / self.num_blocks


class EngineView:
    """The engine as the HTTP handlers and metrics read it, mirrored from the engine process."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.config: EngineConfig = info["config"]
        self.model_config: ModelConfig = info["model_config"]
        self.max_model_len: int = info["max_model_len"]
        self.device: str = info["device"]
        self.dtype: str = info["dtype"]
        self.torch_threads: int = info["torch_threads"]
        self.decode_kernel: str = info["decode_kernel"]
        self.weight_layout: str | None = info["weight_layout"]
        self.warnings: tuple[str, ...] = tuple(info.get("warnings", ()))
        self.gc_frozen_objects: int = info["gc_frozen_objects"]
        self.pid: int = info["pid"]
        self.tokenizer = load_tokenizer(self.model_config)
        self.block_manager = _BlockView(info["num_blocks"], info["block_size"])
        self.step_log = StepLog()
        self.num_running = 0
        self.num_waiting = 0

    def update(self, state: tuple[int, int, int]) -> None:
        self.num_running, self.num_waiting, self.block_manager.num_free_blocks = state


class EngineProcessClient:
    """`AsyncEngine`'s interface over an engine process: add/abort/generate, step waits, liveness."""

    def __init__(self, config: EngineConfig, threads: int, *, max_waiting: int | None = None,
                 observer: EngineObserver | None = None, start_timeout_s: float = 300.0) -> None:
        self.config = config
        self.threads = threads
        self.max_waiting = max_waiting
        self.observer = observer
        self.start_timeout_s = start_timeout_s
        self._view: EngineView | None = None  # set by start()
        self.error: BaseException | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._drain_w: int | None = None  # the drain pipe: tells the engine process this server is stopping
        self._drain_lock = threading.Lock()  # written on the loop, closed by shutdown on any thread
        self._dead: asyncio.Event | None = None  # set when the engine process dies under a running server
        self._stopping = False
        self._ids = itertools.count()
        self._pending: dict[str, tuple[asyncio.Future[Any], RequestStream, int]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._times: dict[str, RequestTimes] = {}
        self._step_waiters = StepWaiters()

    @property
    def engine(self) -> EngineView:
        """The engine's mirrored state; exists once `start` has returned."""
        if self._view is None:
            raise EngineDeadError("the engine process has not started")
        return self._view

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> EngineProcessClient:
        """Spawn the engine process and wait until its engine is built (model loaded, cache allocated)."""
        self._loop = asyncio.get_running_loop()
        self._dead = asyncio.Event()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        drain_r, self._drain_w = os.pipe()
        os.set_blocking(self._drain_w, False)
        try:
            env = env_with_malloc_tunables()
            self._proc = subprocess.Popen([sys.executable, "-m", "itlbench.serving.engine_core",
                                           str(theirs.fileno()), str(drain_r)],
                                          pass_fds=(theirs.fileno(), drain_r), env=env)
        finally:
            theirs.close()
            os.close(drain_r)
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._writer.write(frame(("config", self.config, self.threads)))
        try:
            first = await asyncio.wait_for(self._read(reader), self.start_timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            code = await self._exit_status()
            self._kill()
            raise ItlbenchError(f"the engine process did not start: {describe_exit(self.pid, code)}") from exc
        except TimeoutError as exc:
            self._kill()
            raise ItlbenchError(f"the engine process did not start within {self.start_timeout_s:g} s") from exc
        if first[0] == "error":
            self._kill()
            raise error_from(first[1])
        self._view = EngineView(first[1])
        self._reader_task = asyncio.create_task(self._read_loop(reader), name="itlbench-engine-reader")
        return self

    def draining(self) -> None:
        """The server is stopping on a signal: the engine process keeps serving the drain even when the same
        signal reached it too (a stop of the whole process group), instead of obeying it at once."""
        with self._drain_lock, contextlib.suppress(OSError):  # a full pipe has said it already
            if self._drain_w is not None:
                os.write(self._drain_w, b"d")

    async def wait_dead(self) -> BaseException:
        """Return once the engine process has died while the server was not stopping it: the error says how."""
        assert self._dead is not None, "start() first"
        await self._dead.wait()
        assert self.error is not None
        return self.error

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process; in-flight requests fail with EngineDeadError. Callable from any thread."""
        self._stopping = True
        self.draining()
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._writer is not None:
            with contextlib.suppress(RuntimeError):
                if _on_loop(loop):
                    self._write(("stop",))
                else:
                    loop.call_soon_threadsafe(self._write, ("stop",))
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        self._close_drain()
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                if _on_loop(loop):
                    self._fail_all(EngineDeadError(SHUT_DOWN))
                else:
                    loop.call_soon_threadsafe(self._fail_all, EngineDeadError(SHUT_DOWN))

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_drain()

    def _close_drain(self) -> None:
        with self._drain_lock:
            fd, self._drain_w = self._drain_w, None
        if fd is not None:
            os.close(fd)

    async def _exit_status(self, wait_s: float = 2.0) -> int | None:
        """The engine process's exit status once it is reaped: its socket closes a moment before."""
        deadline = time.monotonic() + wait_s
        while self._proc is not None and self._proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return None if self._proc is None else self._proc.poll()

    async def why_not_alive(self) -> str:
        """How the engine died, as soon as that shows. Its process can be reaped (`is_alive` polls it) before
        the reader has taken what it said on the way out (the exception its loop died of): then wait for the
        reader to reach the end of the socket, which a process that has exited closes, so that what it said,
        not its exit code, is the answer. The wait is bounded in case something it started holds the socket."""
        proc, reader = self._proc, self._reader_task
        if (self.error is None and not self._stopping and proc is not None and proc.poll() is not None
                and reader is not None and not reader.done()):
            await asyncio.wait({reader}, timeout=_LAST_WORDS_S)
        if self.error is not None:
            return str(self.error)
        code = None if proc is None or self._stopping else proc.poll()
        return SHUT_DOWN if code is None else describe_exit(self.pid, code)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def is_alive(self) -> bool:
        return (self._proc is not None and self._proc.poll() is None and not self._stopping
                and self.error is None and self._view is not None)

    @property
    def num_waiting(self) -> int:
        return len(self._pending) + (self._view.num_waiting if self._view else 0)

    # ---- request API (event loop) -------------------------------------------------------------
    async def add(self, prompt: str | Sequence[int], sampling: SamplingParams,
                  request_id: str | None = None, arrival_ns: int | None = None) -> RequestStream:
        if not self.is_alive:
            raise EngineDeadError(await self.why_not_alive())
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise QueueFullError(f"{self.num_waiting} requests waiting (max_waiting={self.max_waiting})")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._pending or rid in self._streams:
            raise ConfigError("request_id", f"{rid!r} is already in flight", "use a unique id")
        arrival = arrival_ns or time.perf_counter_ns()
        admitted: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        stream = RequestStream(self, admitted)  # type: ignore[arg-type]
        self._pending[rid] = (admitted, stream, arrival)
        self._write(("add", rid, prompt if isinstance(prompt, str) else list(prompt), sampling, arrival))
        return await stream.admitted()

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams,
                 request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        return generate(self, prompt, sampling, request_id)

    def abort(self, request_id: str, reason: str = "abort", num_output_tokens: int | None = None) -> None:
        self._write(("abort", request_id, reason, num_output_tokens))

    async def wait_for_step(self, step: int, timeout: float) -> bool:
        """Wait on the event loop until step record `step` exists (or timeout)."""
        return await self._step_waiters.wait(lambda: self.engine.step_log.last_step, step, timeout)

    def _write(self, message: object) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(message))

    # ---- messages from the engine process ----------------------------------------------------
    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Any:
        return await read_frame(reader)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await self._read(reader)
                if msg[0] == "step":
                    self._on_step(*msg[1:])
                elif msg[0] == "failed":
                    self._on_failed(*msg[1:])
                elif msg[0] == "dead":  # its loop died, saying why; the process exits next
                    self.error = EngineDeadError(msg[1])
                    log.error("%s", self.error)
        except (asyncio.IncompleteReadError, ConnectionError):
            if not self._stopping and self.error is None:
                self.error = EngineDeadError(describe_exit(self.pid, await self._exit_status()))
                log.error("%s", self.error)
        except Exception as exc:  # noqa: BLE001 - a bad message must not leave requests hanging
            log.exception("engine message handling failed")
            self.error = engine_stopped(exc, "as its messages could not be read")
        finally:
            self._fail_all(self.error or EngineDeadError(SHUT_DOWN))
            if self.error is not None and self._dead is not None:
                self._dead.set()

    def _on_step(self, replies: list[tuple[Any, ...]], packed: list[tuple[Any, ...]], records: list[StepRecord],
                 times: dict[str, tuple[int | None, int | None, int | None]], state: tuple[int, int, int]) -> None:
        view = self.engine
        assert view is not None
        for reply in replies:
            self._on_reply(reply)
        outputs = [RequestOutput(*p) for p in packed]
        for rid, (scheduled, first, finished) in times.items():
            t = self._times.get(rid)
            if t is not None:
                t.first_scheduled_ns, t.first_token_ns, t.finished_ns = scheduled, first, finished
        view.update(state)
        for rec in records:
            view.step_log.append(rec)
        if self.observer is not None and (records or outputs):
            try:
                self.observer.on_step(records, view)
                if outputs:
                    self.observer.on_outputs(outputs, self._times)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - metrics must never take serving down
                log.exception("engine observer failed")
        streams = self._streams
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is not None:
                stream._put(out)
                if out.finished:
                    del streams[out.request_id]
            if out.finished:
                self._times.pop(out.request_id, None)
        self._step_waiters.wake()

    def _on_reply(self, reply: tuple[Any, ...]) -> None:
        kind, rid = reply[0], reply[1]
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        fut, stream, arrival = pending
        if kind == "rejected":
            if not fut.done():
                fut.set_exception(error_from(reply[2]))
            return
        times = RequestTimes(rid, arrival)
        if stream.finished or fut.done():  # the caller gave up while the add was on its way
            self.abort(rid)
            return
        self._streams[rid] = stream
        self._times[rid] = times
        fut.set_result(times)

    def _on_failed(self, ids: list[str], message: str, state: tuple[int, int, int]) -> None:
        self.engine.update(state)
        err = EngineDeadError(message)
        for rid in ids:
            stream = self._streams.pop(rid, None)
            self._times.pop(rid, None)
            if stream is not None:
                stream._put(err)

    def _fail_all(self, err: BaseException) -> None:
        for fut, _, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for stream in self._streams.values():
            stream._put(err)
        self._streams.clear()
        self._times.clear()
        self._step_waiters.wake()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
