"""What the HTTP server drives: an `EngineClient`, in-process (`AsyncEngine`) or over a socket to an
engine process (`EngineProcessClient`); both hand out `RequestStream`s and expose the engine's
state (`EngineState`) for the handlers and metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.request import Request, RequestOutput, SamplingParams
from itlbench.core.steps import StepLog, StepRecord
from itlbench.core.tokenizer import Tokenizer
from itlbench.errors import ItlbenchError


class EngineDeadError(ItlbenchError):
    """The engine loop is not running (stopped, or a step failed) so the request cannot finish."""


# why an engine that did not die is not alive, and how a stream it cut ends: the server is
# shutting it down (one sentence, so /health, refused requests and cut streams agree)
SHUT_DOWN = "the engine was shut down (the server is stopping)"


_MESSAGE_CHARS = 300  # of an exception's message in the one line; its traceback is in the server's log


def engine_stopped(exc: BaseException, how: str = "") -> EngineDeadError:
    """The error an engine loop that died of `exc` fails its requests with and the server exits with: one line
    naming the exception's type and message (`how`: what led there, e.g. "after 3 failed steps in a row")."""
    message = " ".join(str(exc).split())
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS - 1] + "…"
    name = type(exc).__name__
    head = f"the engine stopped {how}" if how else "the engine stopped"
    err = EngineDeadError(f"{head}: {name}: {message}" if message else f"{head}: {name}")
    err.__cause__ = exc
    return err


class QueueFullError(ItlbenchError):
    """More requests are waiting than the server admits; the client should back off and retry."""


class EngineObserver(Protocol):
    """Hooks called on the engine thread after each step; metrics live behind this."""

    def on_step(self, records: Sequence[StepRecord], engine: EngineState) -> None: ...

    def on_outputs(self, outputs: Sequence[RequestOutput], requests: dict[str, Request]) -> None: ...


class _Aborts(Protocol):
    def abort(self, request_id: str, reason: str = "abort", num_output_tokens: int | None = None) -> None: ...


class RequestStream:
    """Outputs of one request as an async iterator; leaving the iteration early aborts it."""

    def __init__(self, owner: _Aborts, admitted: asyncio.Future[Request]) -> None:
        self._owner = owner
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._admitted = admitted
        self.request: Request | None = None
        self.finished = False

    @property
    def request_id(self) -> str:
        assert self.request is not None
        return self.request.request_id

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def admitted(self) -> RequestStream:
        """Wait for the engine to admit the request; a caller cancelled meanwhile marks the stream
        finished, so whoever admits it late aborts it instead of streaming to nobody."""
        try:
            self.request = await self._admitted
        except asyncio.CancelledError:
            self.finished = True
            raise
        return self

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self.abort()

    def abort(self, reason: str = "abort", num_output_tokens: int | None = None) -> None:
        """Free the request's KV blocks; safe to call from the event loop at any time. `reason` "stop": the
        front end ended it (a stop string) after `num_output_tokens` tokens, which metrics record as a
        finish, not an abort (tokens the engine made meanwhile are not counted there)."""
        if not self.finished and self.request is not None:
            self.finished = True
            self._owner.abort(self.request.request_id, reason, num_output_tokens)


async def generate(client: EngineClient, prompt: str | Sequence[int], sampling: SamplingParams,
                   request_id: str | None = None) -> AsyncIterator[RequestOutput]:
    """Add, then yield outputs until finished (leaving early aborts): `generate` of both clients."""
    stream = await client.add(prompt, sampling, request_id)
    async for out in stream:
        yield out


class StepWaiters:
    """Coroutines waiting on the event loop for a step record to exist; both engine clients wake them
    whenever new records arrive (or the engine dies, so no waiter outlives it)."""

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    async def wait(self, last_step: Callable[[], int], step: int, timeout: float) -> bool:
        if last_step() >= step:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            if fut in self._futures:
                self._futures.remove(fut)
        return last_step() >= step

    def wake(self) -> None:
        futures, self._futures = self._futures, []
        for fut in futures:
            if not fut.done():
                fut.set_result(None)


class BlockUsage(Protocol):
    num_blocks: int
    block_size: int

    @property
    def usage(self) -> float: ...


class EngineState(Protocol):
    """The engine as handlers and metrics read it: the engine itself in-process, a mirror of it
    (`EngineView`) beside an engine process."""

    config: EngineConfig
    model_config: ModelConfig
    max_model_len: int
    device: str
    dtype: str
    tokenizer: Tokenizer
    block_manager: BlockUsage
    step_log: StepLog

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...


class EngineClient(Protocol):
    """Admit, stream and abort requests; wait for step records; report liveness."""

    error: BaseException | None

    @property
    def engine(self) -> EngineState: ...

    @property
    def is_alive(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    async def add(self, prompt: str | Sequence[int], sampling: SamplingParams,
                  request_id: str | None = None, arrival_ns: int | None = None) -> RequestStream: ...

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams,
                 request_id: str | None = None) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str, reason: str = "abort", num_output_tokens: int | None = None) -> None: ...

    async def wait_for_step(self, step: int, timeout: float) -> bool: ...

    async def wait_dead(self) -> BaseException:
        """Return once the engine has died under a running server (not when it is shut down): `error` says how."""
        ...

    async def why_not_alive(self) -> str:
        """Why the engine is not alive, in one line: the exception its loop died of, the failed steps in a row,
        the signal or exit code that ended its process, or that it was shut down. /health, a refused request and
        the server's exit line all say this, so they cannot disagree."""
        ...

    def shutdown(self, timeout: float = 10.0) -> None: ...
