"""A test peer that exports vLLM-shaped request spans through the real OpenTelemetry OTLP/HTTP exporter
(`traces_url`), and/or writes SGLang-shaped scheduler log lines (`sglang_log`).

Why: `--receive-otlp` must be tested with what a server really sends (protobuf over HTTP, batched by the
SDK's BatchSpanProcessor, arriving after the responses), not with hand-made dicts. The peer is the
OpenAIPeer with one engine: a streaming request's prefill holds the engine for
`prefill_s_per_token` × its prompt tokens, during which no stream gets a token (as a prefill does in an
unchunked engine), so an injected long prompt stalls every stream by a known amount. Each finished request
ends one `llm_request` span with the attributes vLLM sets (arrival as the span's start, wall clock; time
to first token; time in queue; time in model prefill; prompt tokens; request id). With `sglang_log`, each
prefill also appends a `[YYYY-MM-DD HH:MM:SS] Prefill batch. #new-seq: 1, #new-token: N, ...` line (local
time, whole seconds, as SGLang's scheduler logs it) and every 40th token a `Decode batch.` line.

`python -m tests.support.traced_peer --port P --otlp-traces-endpoint URL` runs it as a server command
(for `sweep --serve`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from itlbench.testing.openai_peer import OpenAIPeer, PeerConfig, _sse

_KEY = web.RequestKey("traced_peer.admitted", tuple)  # (arrival, scheduled, prompt tokens), wall-clock ns


@dataclass
class TracedConfig(PeerConfig):
    traces_url: str = ""
    prefill_s_per_token: float = 5e-5  # held, not only reported: the engine is busy this long
    export_delay_ms: int = 1000  # BatchSpanProcessor's schedule delay (vLLM keeps the SDK's 5000)
    sglang_log: str = ""  # a file to append SGLang-style scheduler lines to


class TracedPeer(OpenAIPeer):
    cfg: TracedConfig

    def __init__(self, cfg: TracedConfig | None = None) -> None:
        super().__init__(cfg or TracedConfig())
        self._engine = asyncio.Lock()
        self._tokens_out = 0
        self.provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        if self.cfg.traces_url:
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.cfg.traces_url),
                                                                schedule_delay_millis=self.cfg.export_delay_ms))
        self.tracer = self.provider.get_tracer("vllm.llm_engine")

    def _log(self, text: str) -> None:
        if self.cfg.sglang_log:
            with open(self.cfg.sglang_log, "a") as f:
                f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")

    async def stop(self) -> None:
        await super().stop()
        self.provider.shutdown()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        arrival = time.time_ns()
        body = await request.json()  # aiohttp keeps the body: the base class reads it again
        tokens = self._tokens(body)
        if body.get("stream") and isinstance(tokens, list):
            async with self._engine:  # the prefill: every stream waits for it
                scheduled = time.time_ns()
                blocks = set(self._blocks)
                cached = self._cached(tokens)  # what the base class will report; its blocks are added there
                self._blocks = blocks
                self._log(f"Prefill batch. #new-seq: 1, #new-token: {len(tokens) - cached}, #cached-token: {cached}, "
                          f"token usage: 0.01, #running-req: {self.counters.running}, #queue-req: 0, ")
                await asyncio.sleep(len(tokens) * self.cfg.prefill_s_per_token)
            request[_KEY] = (arrival, scheduled, len(tokens))
        return await super()._generate(request)

    async def _stream(self, resp: web.StreamResponse, request: web.Request, rid: str, chat: bool, n_out: int,
                      usage: dict[str, object], fault: str | None) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        first = 0
        for i in range(n_out):
            await asyncio.sleep(self.cfg.tick_s)
            async with self._engine:  # a decode step waits for a running prefill
                pass
            choice = {"index": 0, "finish_reason": "length" if i == n_out - 1 else None}
            choice.update({"delta": {"content": " x"}} if chat else {"text": " x"})
            await resp.write(_sse({"id": rid, "object": obj, "model": self.cfg.model, "choices": [choice]}))
            first = first or time.time_ns()
            self._tokens_out += 1
            if self._tokens_out % 40 == 0:
                self._log(f"Decode batch. #running-req: {self.counters.running}, #token: {self._tokens_out}, "
                          "token usage: 0.01, cuda graph: False, gen throughput (token/s): 100.00, #queue-req: 0, ")
        await resp.write(_sse({"id": rid, "object": obj, "model": self.cfg.model, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        if self.cfg.traces_url:
            self._span(rid, first, *request[_KEY])

    def _span(self, rid: str, first_ns: int, arrival: int, scheduled: int, prompt: int) -> None:
        span = self.tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=arrival, attributes={
            "gen_ai.request.id": rid, "gen_ai.usage.prompt_tokens": prompt,
            "gen_ai.latency.time_to_first_token": (first_ns - arrival) / 1e9,
            "gen_ai.latency.time_in_queue": (scheduled - arrival) / 1e9,
            "gen_ai.latency.time_in_model_prefill": (first_ns - scheduled) / 1e9})
        span.end(end_time=time.time_ns())


async def _serve(cfg: TracedConfig, port: int) -> None:
    peer = TracedPeer(cfg)
    await peer.start("127.0.0.1", port)
    try:
        await asyncio.Event().wait()
    finally:
        await peer.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--otlp-traces-endpoint", required=True)
    p.add_argument("--tick-s", type=float, default=0.01)
    a = p.parse_args(argv)
    import signal

    loop = asyncio.new_event_loop()
    task = loop.create_task(_serve(TracedConfig(traces_url=a.otlp_traces_endpoint, tick_s=a.tick_s), a.port))
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        loop.run_until_complete(task)
    except (asyncio.CancelledError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
