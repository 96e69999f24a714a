"""A paced OpenAI-style streaming server: the reference peer for checking the client's timestamps.

All streams get their next chunk on one global tick (like a batched engine's decode step) and the
server logs each content chunk's send time (`perf_counter_ns`, the client's clock on one host);
`GET /_log` returns that truth
(`sends`, and `arrivals`: when each request's handler began, on the same clock). It also serves a fake `/v1/steps` NDJSON step log and `/metrics`.
Run it in its own process (`python -m itlbench.testing.paced_server --port 0`) when measuring
fidelity, so it does not share the client's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import psutil
from aiohttp import web

from itlbench.core.steps import StepRecord, phase_of

_now = time.perf_counter_ns


@dataclass
class PacedConfig:
    """Server behaviour. `first_delay_s`: wait before a stream's first token (its fake prefill)."""

    tick_s: float = 0.02
    first_delay_s: float = 0.0
    tokens_per_chunk: int = 1
    token_ids: bool = False
    role_chunk: bool = True
    usage: bool = True
    status: int = 200
    pause_at_s: float = -1.0
    pause_s: float = 0.0
    steps_per_connection: int = 0  # >0: close the steps stream after that many lines
    api_key: str = ""  # non-empty: generation needs `Authorization: Bearer <api_key>` (else 401)
    # >0: a server that degrades with load, its capacity known by construction: with more than this many
    # streams decoding, a tick takes tick_s × decoding / degrade_above (token throughput capped at
    # degrade_above / tick_s), so N closed-loop streams see an ITL of tick_s × max(1, N / degrade_above)
    degrade_above: int = 0
    # the first content chunk's text names the request (` [cmpl-N]`), so a harness that keeps the
    # generated text (but not the response id) can be matched to the send log
    tag_text: bool = False
    word: str = " tok"  # each token's text (pick one the harness's tokenizer reads as one token)


@dataclass
class _Stream:
    sid: str
    resp: web.StreamResponse
    chat: bool
    model: str
    remaining: int
    join_ns: int
    done: asyncio.Future[None]
    sent_tokens: int = 0
    log: list[int] = field(default_factory=list)
    finished: bool = False  # the finish chunk, usage and [DONE] are written


class PacedServer:
    def __init__(self, cfg: PacedConfig | None = None) -> None:
        self.cfg = cfg or PacedConfig()
        self.active: list[_Stream] = []
        self.log: dict[str, list[int]] = {}
        self.arrivals: dict[str, int] = {}  # server request id -> perf_counter_ns when its handler began
        self.steps: list[dict[str, object]] = []
        self._n = 0
        self._step_added = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/v1/steps", self._steps)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/_log", self._log)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)  # what `itlbench run --endpoint` probes first
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        self._ticker = asyncio.create_task(self._tick())
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
        for st in self.active:
            if not st.done.done():
                st.done.set_result(None)
        if self._runner:
            await self._runner.cleanup()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        arrival_ns = _now()
        if self.cfg.api_key and request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return web.json_response({"error": {"message": "bad key", "code": 401}}, status=401)
        body = await request.json()
        if self.cfg.status != 200:
            return web.json_response({"error": {"message": "paced server set to fail", "code": self.cfg.status}},
                                     status=self.cfg.status)
        self._n += 1
        st = _Stream(f"cmpl-{self._n}", web.StreamResponse(headers={"Content-Type": "text/event-stream"}),
                     request.path.endswith("/chat/completions"), str(body.get("model", "paced")),
                     int(body.get("max_tokens", 16)), _now() + int(self.cfg.first_delay_s * 1e9),
                     asyncio.get_running_loop().create_future())
        await st.resp.prepare(request)
        if self.cfg.role_chunk:
            await st.resp.write(self._event(st, {"role": "assistant", "content": ""} if st.chat else "", None))
        self.log[st.sid] = st.log
        self.arrivals[st.sid] = arrival_ns
        self.active.append(st)
        try:
            await st.done
            if not st.finished:  # stopped before its last token
                await self._finish(st)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return st.resp

    async def _finish(self, st: _Stream) -> None:
        """The finish chunk, usage and [DONE], written right behind the last content chunk, in its step
        (as a server does): written later, from the handler once the step had served every other stream,
        they and the chunked body's end trailed it by that step's remainder (0.3–0.7 ms at 10 streams), and a
        client that read the last content chunk together with them got the later segment's kernel stamp for it."""
        st.finished = True
        await st.resp.write(self._event(st, {} if st.chat else "", None, finish="length"))
        if self.cfg.usage:
            usage = {"prompt_tokens": 7, "completion_tokens": st.sent_tokens, "total_tokens": 7 + st.sent_tokens}
            await st.resp.write(_sse({"id": st.sid, "object": "chunk", "choices": [], "usage": usage}))
        await st.resp.write(b"data: [DONE]\n\n")
        await st.resp.write_eof()  # the chunked body's end too: from the handler it came as late

    def _event(self, st: _Stream, content: object, ids: list[int] | None, finish: str | None = None) -> bytes:
        choice: dict[str, object] = {"index": 0, "finish_reason": finish}
        if st.chat:
            choice["delta"] = content
        else:
            choice["text"] = content
        if ids is not None:
            choice["token_ids"] = ids
        obj = "chat.completion.chunk" if st.chat else "text_completion"
        return _sse({"id": st.sid, "object": obj, "model": st.model, "choices": [choice]})

    def _content(self, st: _Stream, k: int) -> bytes:
        text = self.cfg.word * k
        if self.cfg.tag_text and st.sent_tokens == 0:
            text = f" [{st.sid}]" + self.cfg.word * (k - 1)
        ids = list(range(st.sent_tokens, st.sent_tokens + k)) if self.cfg.token_ids else None
        return self._event(st, {"content": text} if st.chat else text, ids)

    async def _tick(self) -> None:
        """One global step every tick_s: every joined stream gets its next chunk, each send logged."""
        start = nxt = time.perf_counter()
        paused = self.cfg.pause_at_s < 0
        while True:
            nxt += self._tick_length()
            delay = nxt - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                nxt = time.perf_counter()
            if not paused and time.perf_counter() - start >= self.cfg.pause_at_s:
                paused = True
                await asyncio.sleep(self.cfg.pause_s)
                nxt = time.perf_counter()
            t0 = _now()
            decoded = await self._step(t0)
            self._add_step(t0, decoded)

    def _tick_length(self) -> float:
        knee = self.cfg.degrade_above
        if knee <= 0:
            return self.cfg.tick_s
        decoding = sum(1 for st in self.active if st.join_ns <= _now())
        return self.cfg.tick_s * max(1.0, decoding / knee)

    async def _step(self, t0: int) -> int:
        keep: list[_Stream] = []
        decoded = 0
        for st in self.active:
            if st.join_ns > t0:
                keep.append(st)
                continue
            k = min(self.cfg.tokens_per_chunk, st.remaining)
            data = self._content(st, k)
            st.log.append(_now())
            try:
                await st.resp.write(data)
            except (ConnectionResetError, RuntimeError):
                st.remaining = 0
            st.sent_tokens += k
            st.remaining -= k
            decoded += k
            if st.remaining > 0:
                keep.append(st)
            elif not st.done.done():
                with contextlib.suppress(ConnectionResetError, RuntimeError):
                    await self._finish(st)
                st.done.set_result(None)
        self.active = keep
        return decoded

    def _add_step(self, t0: int, decoded: int) -> None:
        record = StepRecord(
            step=len(self.steps), phase=phase_of(0, decoded), prefill_tokens=0, decode_tokens=decoded,
            num_prefill_reqs=0, num_decode_reqs=decoded, num_running=len(self.active), num_waiting=0,
            num_preemptions=0, kv_usage=0.0, token_budget=None, start_ns=t0, end_ns=_now(),
            wall_start_ns=time.time_ns())
        self.steps.append(record.to_dict())
        self._step_added.set()
        self._step_added = asyncio.Event()

    async def _steps(self, request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("since", 0))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        sent = 0
        while True:
            while since < len(self.steps):
                await resp.write(json.dumps(self.steps[since]).encode() + b"\n")
                since += 1
                sent += 1
                if sent == self.cfg.steps_per_connection:
                    return resp
            if request.transport is None or request.transport.is_closing():
                return resp  # the follower went away: end, so shutting down never waits on this handler
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._step_added.wait(), 0.1)

    async def _metrics(self, request: web.Request) -> web.Response:
        running = len(self.active)
        text = (
            "# HELP itlbench_num_requests_running Requests in decode.\n# TYPE itlbench_num_requests_running gauge\n"
            f'itlbench_num_requests_running{{model_name="paced"}} {running}\n'
            "# HELP itlbench_time_to_first_token_seconds TTFT.\n# TYPE itlbench_time_to_first_token_seconds histogram\n"
            f'itlbench_time_to_first_token_seconds_bucket{{le="0.1"}} {self._n}\n'
            f'itlbench_time_to_first_token_seconds_bucket{{le="+Inf"}} {self._n}\n'
            f"itlbench_time_to_first_token_seconds_sum {self._n * 0.02}\n"
            f"itlbench_time_to_first_token_seconds_count {self._n}\n"
            "# HELP process_open_fds Open fds.\n# TYPE process_open_fds gauge\nprocess_open_fds 12\n")
        return web.Response(text=text, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "paced", "object": "model", "owned_by": "itlbench"}]})

    async def _log(self, request: web.Request) -> web.Response:
        cpu = psutil.Process().cpu_times()
        # wall_minus_perf_ns maps a harness's wall-clock stamps (time.time) onto the log's perf_counter_ns
        return web.json_response({"sends": self.log, "arrivals": self.arrivals, "cpu_s": cpu.user + cpu.system,
                                  "wall_minus_perf_ns": time.time_ns() - _now()})


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@contextlib.contextmanager
def serve_in_thread(cfg: PacedConfig | None = None) -> Iterator[tuple[PacedServer, str]]:
    """Run a server on its own event loop in a thread; yields (server, base_url ending in /v1)."""
    loop = asyncio.new_event_loop()
    server = PacedServer(cfg)
    ready: list[int] = []
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        ready.append(loop.run_until_complete(server.start()))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield server, f"http://127.0.0.1:{ready[0]}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def spawn(cfg: PacedConfig | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start a server in a separate process; returns (process, base_url ending in /v1)."""
    cfg = cfg or PacedConfig()
    args = [sys.executable, "-m", "itlbench.testing.paced_server", "--port", "0"]
    for f in fields(cfg):
        args += [f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name))]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"paced server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def _parse(argv: list[str] | None) -> tuple[PacedConfig, str, int]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    for f in fields(PacedConfig):
        kind = (lambda s: s == "True") if f.type == "bool" else {"float": float, "int": int, "str": str}[str(f.type)]
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    a = vars(p.parse_args(argv))
    host, port = a.pop("host"), a.pop("port")
    return PacedConfig(**a), host, port


async def _serve(cfg: PacedConfig, host: str, port: int) -> None:
    server = PacedServer(cfg)
    print(f"PORT {await server.start(host, port)}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    cfg, host, port = _parse(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(cfg, host, port))


if __name__ == "__main__":
    main()
