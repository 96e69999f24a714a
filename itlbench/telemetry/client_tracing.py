"""One CLIENT span per request and the GenAI client metrics, following the GenAI semantic conventions.

The span, named `{gen_ai.operation.name} {gen_ai.request.model}`, opens just before the request is
written and closes when its stream ends; its context travels to the server as a W3C `traceparent`
header, so the server's span of the same request joins the trace. `gen_ai.response.time_to_first_chunk`
is first content chunk − send (the conventions' definition; itlbench's TTFT counts from the scheduled
send time instead and is on the `itlbench.*` attributes and in Prometheus).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from opentelemetry.propagators.textmap import DefaultSetter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from itlbench.analysis.buckets import bucket_for
from itlbench.load.target import Target
from itlbench.telemetry.otel import DURATION_BUCKETS, TOKEN_USAGE_BUCKETS, Clock, OtelProviders

_PROPAGATOR = TraceContextTextMapPropagator()
_SETTER = DefaultSetter()


def operation_of(api: str) -> str:
    return ga.GenAiOperationNameValues.CHAT.value if api == "chat" else ga.GenAiOperationNameValues.TEXT_COMPLETION.value


def error_type(status: str, http_status: int | None) -> str:
    """A low-cardinality `error.type`: the HTTP status when the server answered one, else the client's
    outcome (timeout, cancelled) or `_OTHER`."""
    if http_status is not None and http_status != 200:
        return str(http_status)
    return status if status in ("timeout", "cancelled") else "_OTHER"


class ClientTracing:
    """Spans and `gen_ai.client.*` metrics of one run's requests against one target."""

    def __init__(self, providers: OtelProviders, target: Target, provider_name: str) -> None:
        self.tracer = providers.tracer("itlbench.client")
        meter = providers.meter("itlbench.client")
        self.duration = meter.create_histogram(
            gm.GEN_AI_CLIENT_OPERATION_DURATION, unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.token_usage = meter.create_histogram(
            gm.GEN_AI_CLIENT_TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS)
        self.target = target
        self.operation = operation_of(target.api)
        self.span_name = f"{self.operation} {target.model}"
        url = urllib.parse.urlparse(target.base_url)
        self.attributes: dict[str, Any] = {
            ga.GEN_AI_OPERATION_NAME: self.operation, ga.GEN_AI_PROVIDER_NAME: provider_name,
            ga.GEN_AI_REQUEST_MODEL: target.model, server_attributes.SERVER_ADDRESS: url.hostname or "",
            server_attributes.SERVER_PORT: url.port or (443 if url.scheme == "https" else 80)}
        self.clock = Clock()

    def start(self, ex: Any, now_ns: int) -> tuple[Any, dict[str, str]]:
        """Open the request's span; returns it and the headers that carry its context."""
        plan = ex.plan
        attrs = {**self.attributes, ga.GEN_AI_REQUEST_MAX_TOKENS: plan.max_tokens,
                 ga.GEN_AI_REQUEST_TEMPERATURE: self.target.temperature, ga.GEN_AI_REQUEST_STREAM: True,
                 "itlbench.request.id": plan.request_id, "itlbench.workload": plan.workload,
                 "itlbench.injected": plan.injected, "itlbench.prompt_bucket": bucket_for(plan.prompt_tokens),
                 "itlbench.request.send_lag": (now_ns - ex.scheduled_ns) / 1e9}
        span = self.tracer.start_span(self.span_name, kind=SpanKind.CLIENT, attributes=attrs,
                                      start_time=self.clock.epoch(now_ns))
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers, context=set_span_in_context(span), setter=_SETTER)
        return span, headers

    def end(self, span: Any, ex: Any, done_ns: int) -> None:
        """Close the span with usage, finish reason and time to first chunk; record the metrics."""
        plan = ex.plan
        sent = ex.sent_ns if ex.sent_ns is not None else done_ns
        input_tokens = ex.prompt_reported if ex.prompt_reported is not None else plan.prompt_tokens
        output_tokens = ex.completion_reported if ex.completion_reported is not None else ex.tokens
        attrs: dict[str, Any] = {ga.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
                                 ga.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens}
        if ex.server_id:
            attrs[ga.GEN_AI_RESPONSE_ID] = ex.server_id
        if ex.finish_reason:
            attrs[ga.GEN_AI_RESPONSE_FINISH_REASONS] = [ex.finish_reason]
        if ex.times:
            attrs[ga.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = (ex.times[0] - sent) / 1e9
            attrs["itlbench.ttft"] = (ex.times[0] - ex.scheduled_ns) / 1e9
        metric_attrs = dict(self.attributes)
        if ex.status != "ok":
            etype = error_type(ex.status, ex.http_status)
            attrs[error_attributes.ERROR_TYPE] = etype
            metric_attrs[error_attributes.ERROR_TYPE] = etype
            span.set_status(Status(StatusCode.ERROR, ex.error or ex.status))
        span.set_attributes(attrs)
        span.end(end_time=self.clock.epoch(done_ns))
        self.duration.record((done_ns - sent) / 1e9, metric_attrs)
        if ex.status == "ok":
            token_type = ga.GEN_AI_TOKEN_TYPE
            self.token_usage.record(input_tokens, {**self.attributes, token_type: "input"})
            self.token_usage.record(output_tokens, {**self.attributes, token_type: "output"})
