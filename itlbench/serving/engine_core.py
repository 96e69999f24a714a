"""The engine process: owns the `Engine` and loops — take in commands, step, send one message per
step with every output, the new step records and the queue state (`python -m itlbench.serving.engine_core FD DRAIN_FD`).

It exits when the socket closes, and asks Linux to SIGTERM it when its parent dies, so it never
outlives its front end (`itlbench.serving.process_client`). A SIGTERM of its own is obeyed within a
second unless the front end says, on the drain pipe, that it is stopping too (`_on_sigterm`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any

from itlbench.core.engine import SteppedEngine
from itlbench.core.request import RequestOutput, SamplingParams
from itlbench.core.steps import StepLog, StepRecord
from itlbench.errors import ItlbenchError
from itlbench.serving.client import engine_stopped
from itlbench.serving.step_failures import EngineDeclaredDead, FailedSteps
from itlbench.serving.wire import Channel, error_tuple
from itlbench.system.heap import freeze_heap
from itlbench.system.parent import die_with_parent

log = logging.getLogger("itlbench.engine.process")

_EMPTY_STEP_PAUSE_S = 0.001
_CORE_LOG_RECORDS = 4096  # records are sent every step; the engine process needs only the latest
_SIGTERM_GRACE_S = 80.0  # past the front end's drain (60 s) and its wait for this process (10 s)
_DRAIN_NOTICE_S = 1.0  # how long a SIGTERM waits for the front end's word that the whole group is stopping
_grace_timer: threading.Timer | None = None  # armed by the first SIGTERM of a group stop


class EngineCore:
    """The engine process's loop: commands in, one step, one message out."""

    def __init__(self, engine: SteppedEngine, channel: Channel) -> None:
        self.engine = engine
        self.chan = channel
        self._requests: dict[str, Any] = {}
        self._next_step = engine.step_log.last_step + 1
        self._prev_end_ns: int | None = None
        self._failed_steps = FailedSteps()

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
                    out = self._abort(*msg[1:])
                    if out is not None:
                        outputs.append(out)
            records: list[StepRecord] = []
            failure: tuple[Any, ...] | None = None
            if self.engine.has_unfinished():
                try:
                    stepped, records, failure = self._step()
                except Exception:  # the loop dies: admissions first, so their streams end with its error
                    if replies or outputs:
                        with contextlib.suppress(OSError):
                            self._send(replies, outputs, [])
                    raise
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
            return ("rejected", request_id, error_tuple(exc))
        self._requests[request_id] = req
        return ("admitted", request_id, req.num_prompt_tokens)

    def _abort(self, request_id: str, reason: str = "abort", num_output_tokens: int | None = None) -> RequestOutput | None:
        """End a request the front end gave up on ("abort") or ended itself ("stop": a stop string, after
        `num_output_tokens`, which its finish reports)."""
        req = self._requests.get(request_id)
        if req is None or not self.engine.abort(request_id):
            return None
        made = req.num_output_tokens
        kept = made if num_output_tokens is None else min(made, num_output_tokens)
        return RequestOutput(request_id, (), True, reason, req.num_prompt_tokens, kept, req.num_cached_tokens,
                             time.perf_counter_ns())

    def _step(self) -> tuple[list[RequestOutput], list[StepRecord], tuple[Any, ...] | None]:
        """Outputs and new records of one step; on a failed step, every in-flight request is aborted
        (its blocks freed) and the third item is the message that fails them at the front end."""
        # the last of too many failed steps in a row raises, ending the loop (`core_main` says why)
        outputs, exc = self._failed_steps.step(self.engine, self._prev_end_ns, log, len(self._requests))
        if exc is not None:
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


def _on_sigterm(parent_pid: int, drain_fd: int, *_: object) -> None:
    """SIGTERM. A stop of the whole process group (systemd's default, `timeout`) reaches the front end too,
    which drains its streams (aiohttp's 60 s at most), then stops this process in order; exiting at once
    would cut those streams. The front end says it is stopping by writing to the drain pipe as soon as its
    own signal arrives: then keep serving, and exit on our own only if no stop comes in time. A SIGTERM
    for this process alone gets no such word: obey it within a second, dying of the signal, so the front
    end sees its engine gone, fails its requests and exits saying so (the pipe is read here, not by the
    engine loop, which may be in a step of several seconds)."""
    if os.getppid() != parent_pid:  # the front end is gone (Linux's parent-death signal)
        os._exit(0)
    if select.select([drain_fd], [], [], _DRAIN_NOTICE_S)[0]:
        global _grace_timer
        if _grace_timer is None:
            _grace_timer = threading.Timer(_SIGTERM_GRACE_S, os._exit, (0,))
            _grace_timer.daemon = True
            _grace_timer.start()
        return
    log.warning("SIGTERM for the engine process alone (the server is not stopping): exiting")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # the exit status names the signal to the front end


def core_main(fd: int, drain_fd: int) -> int:
    """Entry of the engine process (`python -m itlbench.serving.engine_core FD DRAIN_FD`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front end, which stops us
    signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, os.getppid(), drain_fd))
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    chan = Channel(socket.socket(fileno=fd))
    first = chan.receive(None)
    if not first:
        return 0
    _, config, threads = first[0]
    from itlbench.system.threads import apply_torch_threads

    threads = apply_torch_threads(threads)  # what torch then runs with, reported in the hello
    try:
        from itlbench.serving.build import create_engine

        engine = create_engine(config)
        engine.step_log = StepLog(capacity=_CORE_LOG_RECORDS)  # the front end keeps the served history
        frozen = freeze_heap()  # torch's and the model's objects: out of every later collection
    except Exception as exc:  # noqa: BLE001 - reported to the front end, which raises it
        if not isinstance(exc, ItlbenchError):  # a config error prints once, as the front end's one line
            log.exception("engine failed to start")
        chan.send(("error", error_tuple(exc)))
        return 2
    info = engine.runner_info
    chan.send(("hello", {
        "config": engine.config, "model_config": engine.model_config, "max_model_len": engine.max_model_len,
        "num_blocks": engine.block_manager.num_blocks, "block_size": engine.block_manager.block_size,
        "device": engine.device, "dtype": engine.dtype, "torch_threads": threads, "pid": os.getpid(),
        "decode_kernel": info.decode_kernel, "weight_layout": info.weight_layout, "warnings": info.warnings,
        "gc_frozen_objects": frozen, "last_step": engine.step_log.last_step}))
    try:
        EngineCore(engine, chan).run()
    except (BrokenPipeError, ConnectionResetError):
        pass
    except Exception as exc:  # noqa: BLE001 - the loop died: the front end hears why, then sees this process exit
        _report_death(chan, exc)
        return 2
    return 0


def _report_death(chan: Channel, exc: Exception) -> None:
    """Tell the front end, in one line, what the engine loop died of: the error its streams end with, its
    new requests and /health are refused with, and its server exits with (as with an in-process engine)."""
    if isinstance(exc, EngineDeclaredDead):  # failed steps in a row: each one's traceback is in the log already
        error = exc.error
        log.error("%s", error)
    else:
        log.exception("engine loop crashed")
        error = engine_stopped(exc)
    with contextlib.suppress(OSError):
        chan.send(("dead", str(error)))


def run_core_from_argv() -> None:
    if len(sys.argv) != 3:
        print("usage: python -m itlbench.serving.engine_core FD DRAIN_FD (started by the server)", file=sys.stderr)
        sys.exit(2)
    sys.exit(core_main(int(sys.argv[1]), int(sys.argv[2])))


if __name__ == "__main__":
    run_core_from_argv()
