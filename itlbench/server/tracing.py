"""The bundled server's OpenTelemetry: one SERVER span per generation request, `gen_ai.server.*` metrics.

The span continues the client's trace (W3C `traceparent`) and carries what only the engine knows:
queue, prefill and decode times, and the engine steps the request ran in (first, last, how many,
which ones prefilled it, the longest). Those come from the engine observer hooks (`on_step`,
`on_outputs`), which this class implements next to the Prometheus metrics; the handler reads them
when the response ends. Only requests with an open span are followed, so the cost is per traced
request, and nothing is imported or called when `--otlp-endpoint` is not given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.propagate import extract
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode

from itlbench.telemetry.otel import (
    DURATION_BUCKETS,
    PROVIDER,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Clock,
    OtelProviders,
    make_providers,
)

_now = time.perf_counter_ns
log = logging.getLogger("itlbench.server")


@dataclass
class EngineTrace:
    """What the engine did for one request. Written on the engine thread, read when the response ends."""

    first_step: int = -1
    last_step: int = -1
    steps: int = 0
    prefill_steps: list[int] = field(default_factory=list)
    longest_step_ns: int = 0
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    arrival_ns: int | None = None
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None

    def note(self, step: Any, prefill: bool) -> None:
        if prefill:
            self.prefill_steps.append(step.step)
        if step.step == self.last_step:
            return
        if self.first_step < 0:
            self.first_step = step.step
        self.last_step = step.step
        self.steps += 1
        self.longest_step_ns = max(self.longest_step_ns, step.end_ns - step.start_ns)

    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {"itlbench.engine.steps": self.steps}
        if self.steps:
            out.update({"itlbench.engine.step.first": self.first_step, "itlbench.engine.step.last": self.last_step,
                        "itlbench.engine.step.longest": self.longest_step_ns / 1e9,
                        "itlbench.engine.prefill_steps": list(self.prefill_steps)})
        a, s, f, e = self.arrival_ns, self.first_scheduled_ns, self.first_token_ns, self.finished_ns
        if a is not None and s is not None:
            out["itlbench.request.queue_time"] = (s - a) / 1e9
            if f is not None:
                out["itlbench.request.prefill_time"] = (f - s) / 1e9
        if f is not None and e is not None:
            out["itlbench.request.decode_time"] = (e - f) / 1e9
        return out


class ServerTracing:
    """SERVER spans and `gen_ai.server.*` metrics of one server; an engine observer besides."""

    def __init__(self, endpoint: str, model_name: str, *, export_interval_s: float = 5.0,
                 providers: OtelProviders | None = None) -> None:
        self.providers = providers or make_providers(endpoint, "itlbench-server", export_interval_s)
        self.tracer = self.providers.tracer("itlbench.server")
        meter = self.providers.meter("itlbench.server")
        self.request_duration = meter.create_histogram(
            gm.GEN_AI_SERVER_REQUEST_DURATION, unit="s", description="Generative AI server request duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.ttft = meter.create_histogram(
            gm.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, unit="s", description="Time to generate first token.",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS)
        self.tpot = meter.create_histogram(
            gm.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, unit="s",
            description="Time per output token generated after the first token.",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS)
        self.model_name = model_name
        self.clock = Clock()
        self._traced: dict[str, EngineTrace] = {}
        self._last_step: Any = None

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export the last spans, waiting at most `timeout_s`: a collector gone mid-run has the SDK retry each
        batch with backoff, which held a SIGTERMed server up for about 13 s."""
        if not self.providers.shutdown_within(timeout_s):
            log.warning("the OTLP collector took the last spans no faster than %g s: they are lost", timeout_s)

    # ---- engine observer hooks (engine thread, or the front end's loop) --------------------------
    def on_step(self, records: Sequence[Any], engine: Any) -> None:
        traced = self._traced
        for rec in records:
            self._last_step = rec
            for rid in rec.prefill_request_ids:
                t = traced.get(rid)
                if t is not None:
                    t.note(rec, prefill=True)

    def on_outputs(self, outputs: Sequence[Any], requests: Mapping[str, Any]) -> None:
        traced = self._traced
        for out in outputs:
            t = traced.get(out.request_id)
            if t is None:
                continue
            if out.new_token_ids and self._last_step is not None:
                t.note(self._last_step, prefill=False)
            t.output_tokens = out.num_output_tokens
            t.prompt_tokens = out.num_prompt_tokens
            if out.finished:
                req = requests.get(out.request_id)
                if req is not None:
                    t.first_scheduled_ns, t.first_token_ns = req.first_scheduled_ns, req.first_token_ns
                    t.finished_ns = req.finished_ns or out.time_ns
                t.finish_reason, t.finished = out.finish_reason, True

    # ---- request side (event loop) ----------------------------------------------------------------
    def begin(self, request: Any, req: Any, request_id: str, arrival_ns: int, prompt_tokens: int,
              max_tokens: int) -> ServerSpan:
        """Open the SERVER span of a generation request (continuing the caller's trace)."""
        operation = ga.GenAiOperationNameValues.CHAT.value if req.chat else ga.GenAiOperationNameValues.TEXT_COMPLETION.value
        base = {ga.GEN_AI_OPERATION_NAME: operation, ga.GEN_AI_PROVIDER_NAME: PROVIDER,
                ga.GEN_AI_REQUEST_MODEL: req.model or self.model_name,
                server_attributes.SERVER_ADDRESS: request.url.host or "", server_attributes.SERVER_PORT:
                request.url.port or 0}
        attrs = {**base, ga.GEN_AI_REQUEST_MAX_TOKENS: max_tokens, ga.GEN_AI_REQUEST_TEMPERATURE: req.temperature,
                 ga.GEN_AI_REQUEST_TOP_P: req.top_p, ga.GEN_AI_REQUEST_STREAM: req.stream,
                 ga.GEN_AI_RESPONSE_ID: request_id, ga.GEN_AI_RESPONSE_MODEL: self.model_name,
                 ga.GEN_AI_USAGE_INPUT_TOKENS: prompt_tokens}
        if req.seed is not None:
            attrs[ga.GEN_AI_REQUEST_SEED] = req.seed
        span = self.tracer.start_span(f"{operation} {self.model_name}", context=extract(request.headers),
                                      kind=SpanKind.SERVER, attributes=attrs, start_time=self.clock.epoch(arrival_ns))
        trace = EngineTrace(arrival_ns=arrival_ns)
        self._traced[request_id] = trace
        return ServerSpan(self, span, request_id, trace, base)

    def end(self, s: ServerSpan, exc: BaseException | None) -> None:
        self._traced.pop(s.request_id, None)
        t, span = s.trace, s.span
        if s.verdict is not None:  # a stop string ended it: the response's reason and tokens, not the engine's
            t.finish_reason, t.output_tokens = s.verdict
        now = _now()
        attrs = t.attributes()
        attrs[ga.GEN_AI_USAGE_OUTPUT_TOKENS] = t.output_tokens
        if t.finish_reason:
            attrs[ga.GEN_AI_RESPONSE_FINISH_REASONS] = [t.finish_reason]
        if t.first_scheduled_ns is not None:
            span.add_event("itlbench.engine.scheduled", timestamp=self.clock.epoch(t.first_scheduled_ns))
        if t.first_token_ns is not None:
            span.add_event("itlbench.engine.first_token", timestamp=self.clock.epoch(t.first_token_ns))
        metric_attrs = dict(s.base)
        etype = _error_type(exc, t)
        if etype is not None:
            attrs[error_attributes.ERROR_TYPE] = etype
            metric_attrs[error_attributes.ERROR_TYPE] = etype
            span.set_status(Status(StatusCode.ERROR, str(exc) if exc is not None else t.finish_reason))
        span.set_attributes(attrs)
        span.end(end_time=self.clock.epoch(now))
        arrival = t.arrival_ns or now
        self.request_duration.record(((t.finished_ns or now) - arrival) / 1e9, metric_attrs)
        if etype is None and t.first_token_ns is not None:
            self.ttft.record((t.first_token_ns - arrival) / 1e9, metric_attrs)
            if t.finished_ns is not None and t.output_tokens > 1:
                self.tpot.record((t.finished_ns - t.first_token_ns) / 1e9 / (t.output_tokens - 1), metric_attrs)

    def observing(self, metrics: Any) -> EngineObservers:
        """One engine observer for the Prometheus metrics and this tracer."""
        return EngineObservers((metrics, self))


def _error_type(exc: BaseException | None, t: EngineTrace) -> str | None:
    if exc is None:
        return "abort" if t.finish_reason == "abort" else None
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return str(status)
    if isinstance(exc, asyncio.CancelledError | ConnectionError):
        return "client_disconnected"
    return type(exc).__name__


class ServerSpan:
    """`with tracing.begin(...):` around a request's admission and response; errors mark the span."""

    __slots__ = ("tracing", "span", "request_id", "trace", "base", "verdict")

    def __init__(self, tracing: ServerTracing, span: Any, request_id: str, trace: EngineTrace,
                 base: dict[str, Any]) -> None:
        self.tracing, self.span, self.request_id, self.trace, self.base = tracing, span, request_id, trace, base
        self.verdict: tuple[str, int] | None = None  # (finish reason, output tokens) the front end decided

    def __enter__(self) -> ServerSpan:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.tracing.end(self, exc)


class EngineObservers:
    """Several engine observers behind the engine's one observer slot, called in order."""

    def __init__(self, observers: Sequence[Any]) -> None:
        self.observers = tuple(observers)

    def on_step(self, records: Sequence[Any], engine: Any) -> None:
        for o in self.observers:
            o.on_step(records, engine)

    def on_outputs(self, outputs: Sequence[Any], requests: Mapping[str, Any]) -> None:
        for o in self.observers:
            o.on_outputs(outputs, requests)
