"""A small OTLP/HTTP receiver: what an OpenTelemetry collector would get, decoded to plain dicts.

Why in the product: a server that exports per-request spans (vLLM's `--otlp-traces-endpoint`) gives the
otel attribution its prefill windows, and a user should not need a collector to get them;
`itlbench run/sweep/capacity --receive-otlp` starts one of these for the run (span_capture.py). Tests use
it as an OTLP sink too.

It accepts `POST /v1/traces` and `/v1/metrics` with protobuf bodies (`opentelemetry-proto`
messages, gzip or not), answers like a collector, and keeps every span and histogram data point as
plain dicts. `python -m itlbench.telemetry.otlp_receiver --port 0` runs one in its own process.
"""

from __future__ import annotations

import argparse
import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass
class Received:
    """Everything received so far (guarded by `lock`)."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_traces(self, body: bytes) -> None:
        msg = ExportTraceServiceRequest.FromString(body)
        rows = []
        for rs in msg.resource_spans:
            service = _attrs(rs.resource.attributes).get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    rows.append({"service": service, "scope": ss.scope.name, "name": s.name,
                                 "kind": SPAN_KINDS.get(s.kind, str(s.kind)), "trace_id": s.trace_id.hex(),
                                 "span_id": s.span_id.hex(), "parent_span_id": s.parent_span_id.hex(),
                                 "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                                 "attributes": _attrs(s.attributes), "status": s.status.code,
                                 "events": [{"name": e.name, "time_ns": e.time_unix_nano} for e in s.events]})
        with self.lock:
            self.spans.extend(rows)
            self.requests += 1

    def add_metrics(self, body: bytes) -> None:
        msg = ExportMetricsServiceRequest.FromString(body)
        rows = []
        for rm in msg.resource_metrics:
            service = _attrs(rm.resource.attributes).get("service.name")
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        row = {"service": service, "name": m.name, "unit": m.unit, "type": kind,
                               "attributes": _attrs(p.attributes)}
                        if kind == "histogram":
                            row.update(bounds=list(p.explicit_bounds), count=p.count, sum=p.sum,
                                       bucket_counts=list(p.bucket_counts))
                        rows.append(row)
        with self.lock:
            self.points.extend(rows)
            self.requests += 1

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with self.lock:
            return list(self.spans), list(self.points)

    def drop_spans_until(self, ns: int) -> None:
        """Forget the spans that started (wall clock) before `ns`: a long sweep keeps only what later runs need."""
        with self.lock:
            self.spans = [s for s in self.spans if int(s.get("start_ns") or 0) >= ns]


class _Handler(BaseHTTPRequestHandler):
    received: Received

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            self.received.add_traces(body)
            reply = ExportTraceServiceResponse().SerializeToString()
        elif self.path == "/v1/metrics":
            self.received.add_metrics(body)
            reply = ExportMetricsServiceResponse().SerializeToString()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass


class OtlpReceiver:
    """`with OtlpReceiver() as rx:` → rx.endpoint takes OTLP/HTTP; rx.received holds what came."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.received = Received()
        handler = type("Handler", (_Handler,), {"received": self.received})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:  # pragma: no cover - used by benchmarks
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    rx = OtlpReceiver(a.host, a.port).start()
    print(rx.endpoint, flush=True)
    try:
        rx.thread.join()
    except KeyboardInterrupt:
        rx.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
