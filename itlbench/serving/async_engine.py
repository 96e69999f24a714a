"""Drive a synchronous `Engine` from asyncio: one engine thread, many awaiting request streams.

The engine is not thread-safe, so only the engine thread touches it. Callers submit adds and aborts
through a command queue that the thread drains between steps; outputs travel back to the event
loop in one `call_soon_threadsafe` per step (not per token) and fan out to per-request queues.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from itlbench.core.engine import SteppedEngine
from itlbench.core.request import Request, RequestOutput, SamplingParams
from itlbench.core.steps import StepRecord
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
from itlbench.serving.step_failures import EngineDeclaredDead, FailedSteps

log = logging.getLogger("itlbench.engine.async")

_EMPTY_STEP_PAUSE_S = 0.001


@dataclass
class _Add:
    prompt: str | Sequence[int]
    sampling: SamplingParams
    request_id: str | None
    arrival_ns: int
    stream: RequestStream


@dataclass
class _Abort:
    request_id: str
    reason: str = "abort"
    num_output_tokens: int | None = None


@dataclass
class _Shared:
    """State both threads touch, guarded by `cond`."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    commands: deque[_Add | _Abort] = field(default_factory=deque)
    pending_adds: int = 0
    stopping: bool = False


class AsyncEngine:
    """The in-process `EngineClient`: runs `engine.step()` on a dedicated thread that sleeps on a
    condition while idle."""

    def __init__(self, engine: SteppedEngine, *, max_waiting: int | None = None,
                 observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.observer = observer
        self._shared = _Shared()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._streams: dict[str, RequestStream] = {}  # event-loop side
        self._requests: dict[str, Request] = {}  # engine-thread side
        self._next_step = 0
        self._step_waiters = StepWaiters()
        self._prev_end_ns: int | None = None  # end of the last step, unless the thread idled since
        self._failed_steps = FailedSteps()
        self.error: BaseException | None = None  # set when the engine loop dies: EngineDeadError naming why
        self._dead: asyncio.Event | None = None  # set on the event loop once it has

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Bind to the running (or given) event loop and start the engine thread."""
        self._loop = loop or asyncio.get_running_loop()
        self._dead = asyncio.Event()
        self._next_step = self.engine.step_log.last_step + 1
        self._thread = threading.Thread(target=self._run, name="itlbench-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current step; in-flight requests fail with EngineDeadError."""
        with self._shared.cond:
            self._shared.stopping = True
            self._shared.cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    async def wait_dead(self) -> BaseException:
        """Return once the engine loop has died of an exception (a shutdown is no death): `error` says which,
        in one line; the requests in flight have been failed with it first."""
        assert self._dead is not None, "start() first"
        await self._dead.wait()
        assert self.error is not None
        return self.error

    async def why_not_alive(self) -> str:
        """The loop sets `error` before its thread ends, so it is never late here: the exception the loop died
        of (or the failed steps in a row), else the shutdown."""
        return SHUT_DOWN if self.error is None else str(self.error)

    @property
    def is_alive(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()
                and not self._shared.stopping and self.error is None)

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: queued commands plus the scheduler's waiting queue."""
        return self._shared.pending_adds + int(self.engine.num_waiting)

    # ---- request API (event loop) -------------------------------------------------------------
    async def add(self, prompt: str | Sequence[int], sampling: SamplingParams,
                  request_id: str | None = None, arrival_ns: int | None = None) -> RequestStream:
        """Admit a request; raises the engine's ConfigError for bad input, QueueFullError when full."""
        if not self.is_alive:
            raise EngineDeadError(await self.why_not_alive())
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise QueueFullError(f"{self.num_waiting} requests waiting (max_waiting={self.max_waiting})")
        admitted: asyncio.Future[Request] = asyncio.get_running_loop().create_future()
        stream = RequestStream(self, admitted)
        cmd = _Add(prompt, sampling, request_id, arrival_ns or time.perf_counter_ns(), stream)
        with self._shared.cond:
            self._shared.commands.append(cmd)
            self._shared.pending_adds += 1
            self._shared.cond.notify()
        return await stream.admitted()

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams,
                 request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        return generate(self, prompt, sampling, request_id)

    def abort(self, request_id: str, reason: str = "abort", num_output_tokens: int | None = None) -> None:
        with self._shared.cond:
            self._shared.commands.append(_Abort(request_id, reason, num_output_tokens))
            self._shared.cond.notify()

    async def wait_for_step(self, step: int, timeout: float) -> bool:
        """Wait on the event loop until step record `step` exists (or timeout)."""
        return await self._step_waiters.wait(lambda: self.engine.step_log.last_step, step, timeout)

    # ---- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._drain_commands()
                if self.engine.has_unfinished():
                    self._step()
        except EngineDeclaredDead as dead:  # failed steps in a row: each one's traceback is in the log already
            log.error("%s", dead.error)
            self.error = dead.error
        except BaseException as exc:  # noqa: BLE001 - the loop must report, never die silently
            log.exception("engine loop crashed")  # the traceback goes to the server's log
            self.error = engine_stopped(exc)
        finally:
            self._fail_all(self.error or EngineDeadError(SHUT_DOWN))
            if self.error is not None and self._dead is not None:  # after the failures: streams end first
                self._call(self._dead.set)

    def _wait_for_work(self) -> bool:
        sh = self._shared
        with sh.cond:
            if not (sh.stopping or sh.commands or self.engine.has_unfinished()):
                self._prev_end_ns = None  # an idle wait is not hand-off time
                sh.cond.wait_for(lambda: sh.stopping or sh.commands or self.engine.has_unfinished())
            return not sh.stopping

    def _drain_commands(self) -> None:
        sh = self._shared
        with sh.cond:
            commands = list(sh.commands)
            sh.commands.clear()
        for cmd in commands:
            if isinstance(cmd, _Add):
                self._do_add(cmd)
            else:
                self._do_abort(cmd)

    def _do_add(self, cmd: _Add) -> None:
        fut = cmd.stream._admitted
        try:
            req = self.engine.add_request(cmd.prompt, cmd.sampling, request_id=cmd.request_id,
                                          arrival_ns=cmd.arrival_ns)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller as its error
            self._call(_settle, fut, None, exc)
        else:
            self._requests[req.request_id] = req
            self._call(self._register, cmd.stream, req)
            self._call(_settle, fut, req, None)
        finally:
            with self._shared.cond:
                self._shared.pending_adds -= 1

    def _do_abort(self, cmd: _Abort) -> None:
        request_id = cmd.request_id
        req = self._requests.get(request_id)
        if req is None:
            return
        self.engine.abort(request_id)
        out = RequestOutput(request_id, (), True, cmd.reason, req.num_prompt_tokens,
                            _kept(req.num_output_tokens, cmd.num_output_tokens), req.num_cached_tokens,
                            time.perf_counter_ns())
        self._observe([], [out])
        del self._requests[request_id]
        self._call(self._unregister, request_id)

    def _step(self) -> None:
        # the last of too many failed steps in a row raises, ending the loop and failing them all
        outputs, exc = self._failed_steps.step(self.engine, self._prev_end_ns, log, len(self._requests))
        if exc is not None:
            self._prev_end_ns = None
            self._recover(exc)
            return
        records = self._new_records()
        self._prev_end_ns = records[-1].end_ns if records else None
        if not records and not outputs:
            self._idle_pause()
        self._observe(records, outputs)
        for out in outputs:
            if out.finished:
                self._requests.pop(out.request_id, None)
        self._call(self._dispatch, outputs)

    def _idle_pause(self) -> None:
        """An empty step (nothing schedulable yet) must not spin the CPU the model needs."""
        with self._shared.cond:
            self._shared.cond.wait(_EMPTY_STEP_PAUSE_S)

    def _new_records(self) -> list[StepRecord]:
        log_ = self.engine.step_log
        if log_.last_step < self._next_step:
            return []
        records = log_.since(self._next_step)
        self._next_step = log_.last_step + 1
        return records

    def _observe(self, records: Sequence[StepRecord], outputs: Sequence[RequestOutput]) -> None:
        if self.observer is None:
            return
        try:
            self.observer.on_step(records, self.engine)
            if outputs:
                self.observer.on_outputs(outputs, self._requests)
        except Exception:  # noqa: BLE001 - metrics must never take the engine down
            log.exception("engine observer failed")

    def _recover(self, exc: Exception) -> None:
        """Abort every in-flight request so its blocks are freed; a failed abort kills the loop."""
        ids = list(self._requests)
        self._requests.clear()
        err = EngineDeadError(f"engine step failed: {exc!r}")
        for rid in ids:
            self.engine.abort(rid)
        self._call(self._fail_ids, ids, err)

    def _fail_all(self, err: BaseException) -> None:
        self._requests.clear()
        sh = self._shared
        with sh.cond:
            pending = [c for c in sh.commands if isinstance(c, _Add)]
            sh.commands.clear()
            sh.pending_adds = 0
        for cmd in pending:
            self._call(_settle, cmd.stream._admitted, None, err)
        self._call(self._fail_ids, None, err)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed between the check and the call
                pass

    # ---- event-loop callbacks ----------------------------------------------------------------
    def _register(self, stream: RequestStream, req: Request) -> None:
        if stream.finished:  # the caller gave up while the add was queued
            self.abort(req.request_id)
        else:
            self._streams[req.request_id] = stream

    def _unregister(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        streams = self._streams
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is not None:
                stream._put(out)
                if out.finished:
                    del streams[out.request_id]
        self._step_waiters.wake()

    def _fail_ids(self, ids: list[str] | None, err: BaseException) -> None:
        targets = list(self._streams) if ids is None else ids
        for rid in targets:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream._put(err)


def _kept(made: int, kept: int | None) -> int:
    """The output tokens a finish reports: those the response kept when the front end ended it."""
    return made if kept is None else min(made, kept)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
