"""The engine core in its own process, driven from the HTTP front end over a Unix socket.

In one process, the engine thread and the aiohttp loop that writes every token share one interpreter
and, on a small box, the cores that torch's threads also want. Here the engine process owns the
`Engine` and loops: take in commands, step, send one message per step with every output, the new
step records and the queue state. The front end (`EngineProcessClient`, same interface as
`AsyncEngine`) mirrors the step log, feeds the metrics observer and fans outputs out to request
streams, and never imports torch.

Wire: 8-byte little-endian length, then a pickle. Front end -> core: ("add", id, prompt, sampling,
arrival_ns), ("abort", id), ("stop",). Core -> front end: ("hello", info) once, then
("step", replies, outputs, records, finish_times, state) and ("failed", ids, message).
The core exits when the socket closes, so it never outlives its front end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from itlbench.engine.async_engine import EngineDeadError, EngineObserver, QueueFullError, RequestStream
from itlbench.engine.config import EngineConfig, ModelConfig
from itlbench.engine.instrument import StepLog, StepRecord
from itlbench.engine.malloc_tuning import env_with_malloc_tunables
from itlbench.engine.request import RequestOutput, SamplingParams
from itlbench.engine.tokenizer import load_tokenizer
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.heap import freeze_heap

log = logging.getLogger("itlbench.engine.process")

_HEADER = struct.Struct("<Q")
_EMPTY_STEP_PAUSE_S = 0.001
_CORE_LOG_RECORDS = 4096  # records are sent every step; the engine process needs only the latest


def _frame(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _error_tuple(exc: BaseException) -> tuple[str, ...]:
    """Exceptions cross as plain tuples: ConfigError's constructor does not round-trip through pickle."""
    if isinstance(exc, ConfigError):
        return ("config", exc.field, exc.problem, exc.fix)
    return ("other", f"{type(exc).__name__}: {exc}")


def _error_from(t: Sequence[str]) -> Exception:
    if t[0] == "config":
        return ConfigError(t[1], t[2], t[3])
    return ItlbenchError(t[1])


# ================================================================ engine process side


class _Channel:
    """Blocking framed messages over the socket; `receive` drains what has arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def send(self, message: object) -> None:
        self.sock.sendall(_frame(message))

    def receive(self, timeout: float | None) -> list[Any] | None:
        """Messages available now; waits up to `timeout` (None: forever) for the first. None at EOF."""
        messages: list[Any] = []
        while True:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return messages
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self._buf += data
            messages.extend(self._parse())
            if messages:
                timeout = 0.0  # got something: take the rest without waiting

    def _parse(self) -> list[Any]:
        out, buf, pos = [], self._buf, 0
        while len(buf) - pos >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buf, pos)
            if len(buf) - pos - _HEADER.size < n:
                break
            start = pos + _HEADER.size
            out.append(pickle.loads(buf[start:start + n]))
            pos = start + n
        del buf[:pos]
        return out


class EngineCore:
    """The engine process's loop: commands in, one step, one message out."""

    def __init__(self, engine: Any, channel: _Channel) -> None:
        self.engine = engine
        self.chan = channel
        self._requests: dict[str, Any] = {}
        self._next_step = engine.step_log.last_step + 1
        self._prev_end_ns: int | None = None

    def run(self) -> None:
        pause: float | None = None
        while True:
            busy = self.engine.has_unfinished()
            messages = self.chan.receive(pause if pause is not None else (0.0 if busy else None))
            pause = None
            if messages is None:
                return  # the front end is gone
            if not busy:
                self._prev_end_ns = None  # idle wait: not hand-off time
            replies: list[tuple[Any, ...]] = []
            outputs: list[RequestOutput] = []
            for msg in messages:
                if msg[0] == "stop":
                    return
                if msg[0] == "add":
                    replies.append(self._add(*msg[1:]))
                elif msg[0] == "abort":
                    out = self._abort(msg[1])
                    if out is not None:
                        outputs.append(out)
            records: list[StepRecord] = []
            failure: tuple[Any, ...] | None = None
            if self.engine.has_unfinished():
                stepped, records, failure = self._step()
                outputs.extend(stepped)
                if not records and not stepped and failure is None:
                    pause = _EMPTY_STEP_PAUSE_S  # nothing schedulable yet: do not spin the core
            if replies or outputs or records:
                self._send(replies, outputs, records)
            if failure is not None:  # after the admissions it names, so the front end knows them
                self.chan.send(failure)

    def _add(self, request_id: str, prompt: Any, sampling: SamplingParams, arrival_ns: int) -> tuple[Any, ...]:
        try:
            req = self.engine.add_request(prompt, sampling, request_id=request_id, arrival_ns=arrival_ns)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller as its error
            return ("rejected", request_id, _error_tuple(exc))
        self._requests[request_id] = req
        return ("admitted", request_id, req.num_prompt_tokens)

    def _abort(self, request_id: str) -> RequestOutput | None:
        req = self._requests.get(request_id)
        if req is None or not self.engine.abort(request_id):
            return None
        return RequestOutput(request_id, (), True, "abort", req.num_prompt_tokens, req.num_output_tokens,
                             req.num_cached_tokens, time.perf_counter_ns())

    def _step(self) -> tuple[list[RequestOutput], list[StepRecord], tuple[Any, ...] | None]:
        """Outputs and new records of one step; on a failed step, every in-flight request is aborted
        (its blocks freed) and the third item is the message that fails them at the front end."""
        if self._prev_end_ns is not None:
            self.engine.note_handoff(time.perf_counter_ns() - self._prev_end_ns)
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving if the engine recovers
            log.exception("engine step failed; failing %d in-flight requests", len(self._requests))
            self._prev_end_ns = None
            ids = list(self._requests)
            self._requests.clear()
            for rid in ids:
                self.engine.abort(rid)
            return [], [], ("failed", ids, f"engine step failed: {exc!r}", self._state())
        log_ = self.engine.step_log
        records = log_.since(self._next_step) if log_.last_step >= self._next_step else []
        if records:
            self._next_step = records[-1].step + 1
        self._prev_end_ns = records[-1].end_ns if records else None
        return outputs, records, None

    def _send(self, replies: list[tuple[Any, ...]], outputs: list[RequestOutput], records: list[StepRecord]) -> None:
        packed, times = [], {}
        for o in outputs:
            packed.append((o.request_id, o.new_token_ids, o.finished, o.finish_reason, o.num_prompt_tokens,
                           o.num_output_tokens, o.num_cached_tokens, o.time_ns))
            if o.finished:
                req = self._requests.pop(o.request_id, None)
                if req is not None:
                    times[o.request_id] = (req.first_scheduled_ns, req.first_token_ns, req.finished_ns)
        self.chan.send(("step", replies, packed, records, times, self._state()))

    def _state(self) -> tuple[int, int, int]:
        e = self.engine
        return e.num_running, e.num_waiting, e.block_manager.num_free_blocks


def _die_with_parent() -> None:
    """SIGTERM this process when its parent dies (Linux), besides the EOF the socket gives."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def core_main(fd: int) -> int:
    """Entry of the engine process (`python -m itlbench.engine.engine_process FD`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front end, which stops us
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chan = _Channel(socket.socket(fileno=fd))
    first = chan.receive(None)
    if not first:
        return 0
    _, config, threads = first[0]
    from itlbench.engine.threads import apply_torch_threads

    apply_torch_threads(threads)
    try:
        from itlbench.engine.engine import create_engine

        engine = create_engine(config)
        engine.step_log = StepLog(capacity=_CORE_LOG_RECORDS)  # the front end keeps the served history
        frozen = freeze_heap()  # torch's and the model's objects: out of every later collection
    except Exception as exc:  # noqa: BLE001 - reported to the front end, which raises it
        log.exception("engine failed to start")
        chan.send(("error", _error_tuple(exc)))
        return 2
    backend = getattr(engine.runner, "backend", None)
    chan.send(("hello", {
        "config": engine.config, "model_config": engine.model_config, "max_model_len": engine.max_model_len,
        "num_blocks": engine.block_manager.num_blocks, "block_size": engine.block_manager.block_size,
        "device": engine.device, "dtype": engine.dtype, "torch_threads": threads, "pid": os.getpid(),
        "decode_kernel": getattr(backend, "decode_kernel", getattr(backend, "name", "?")),
        "weight_layout": getattr(engine.runner, "weight_layout", None),
        "gc_frozen_objects": frozen, "last_step": engine.step_log.last_step}))
    try:
        EngineCore(engine, chan).run()
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


# ================================================================ front end side


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
        self.engine: EngineView | None = None  # set by start()
        self.error: BaseException | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ids = itertools.count()
        self._pending: dict[str, tuple[asyncio.Future[Any], RequestStream, int]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._times: dict[str, RequestTimes] = {}
        self._step_waiters: list[asyncio.Future[None]] = []

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> EngineProcessClient:
        """Spawn the engine process and wait until its engine is built (model loaded, cache allocated)."""
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = env_with_malloc_tunables()
            self._proc = subprocess.Popen([sys.executable, "-m", "itlbench.engine.engine_process",
                                           str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=env)
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._writer.write(_frame(("config", self.config, self.threads)))
        try:
            first = await asyncio.wait_for(self._read(reader), self.start_timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            self._kill()
            raise ItlbenchError(f"the engine process did not start: {exc!r}") from exc
        if first[0] == "error":
            self._kill()
            raise _error_from(first[1])
        self.engine = EngineView(first[1])
        self._reader_task = asyncio.create_task(self._read_loop(reader), name="itlbench-engine-reader")
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process; in-flight requests fail with EngineDeadError. Callable from any thread."""
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._writer is not None:
            with contextlib.suppress(RuntimeError):
                if _on_loop(loop):
                    self._writer.write(_frame(("stop",)))
                else:
                    loop.call_soon_threadsafe(self._write, ("stop",))
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                if _on_loop(loop):
                    self._fail_all(EngineDeadError("engine stopped: shutdown"))
                else:
                    loop.call_soon_threadsafe(self._fail_all, EngineDeadError("engine stopped: shutdown"))

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def is_alive(self) -> bool:
        return (self._proc is not None and self._proc.poll() is None and not self._stopping
                and self.error is None and self.engine is not None)

    @property
    def num_waiting(self) -> int:
        return len(self._pending) + (self.engine.num_waiting if self.engine else 0)

    # ---- request API (event loop) -------------------------------------------------------------
    async def add(self, prompt: str | Sequence[int], sampling: SamplingParams,
                  request_id: str | None = None, arrival_ns: int | None = None) -> RequestStream:
        if not self.is_alive:
            raise EngineDeadError("engine loop is not running")
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
        try:
            stream.request = await admitted
        except asyncio.CancelledError:
            stream.finished = True  # the admission handler sees this and aborts the late admission
            raise
        return stream

    async def generate(self, prompt: str | Sequence[int], sampling: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        stream = await self.add(prompt, sampling, request_id)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        self._write(("abort", request_id))

    async def wait_for_step(self, step: int, timeout: float) -> bool:
        assert self.engine is not None
        if self.engine.step_log.last_step >= step:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._step_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            if fut in self._step_waiters:
                self._step_waiters.remove(fut)
        return self.engine.step_log.last_step >= step

    def _write(self, message: object) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(_frame(message))

    # ---- messages from the engine process ----------------------------------------------------
    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Any:
        (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        return pickle.loads(await reader.readexactly(n))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await self._read(reader)
                if msg[0] == "step":
                    self._on_step(*msg[1:])
                elif msg[0] == "failed":
                    self._on_failed(*msg[1:])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bad message must not leave requests hanging
            log.exception("engine message handling failed")
            self.error = exc
        finally:
            code = None if self._proc is None else self._proc.poll()
            if not self._stopping and self.error is None:
                self.error = EngineDeadError(f"the engine process exited (code {code})")
                log.error("%s", self.error)
            self._fail_all(EngineDeadError(f"engine stopped: {self.error or 'shutdown'}"))

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
        waiters, self._step_waiters = self._step_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _on_reply(self, reply: tuple[Any, ...]) -> None:
        kind, rid = reply[0], reply[1]
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        fut, stream, arrival = pending
        if kind == "rejected":
            if not fut.done():
                fut.set_exception(_error_from(reply[2]))
            return
        times = RequestTimes(rid, arrival)
        if stream.finished or fut.done():  # the caller gave up while the add was on its way
            self.abort(rid)
            return
        self._streams[rid] = stream
        self._times[rid] = times
        fut.set_result(times)

    def _on_failed(self, ids: list[str], message: str, state: tuple[int, int, int]) -> None:
        assert self.engine is not None
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
        waiters, self._step_waiters = self._step_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run_core_from_argv() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m itlbench.engine.engine_process FD (started by the server)", file=sys.stderr)
        sys.exit(2)
    sys.exit(core_main(int(sys.argv[1])))


if __name__ == "__main__":
    run_core_from_argv()

__all__ = ["EngineCore", "EngineProcessClient", "EngineView", "RequestTimes", "core_main"]
