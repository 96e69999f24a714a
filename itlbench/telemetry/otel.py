"""OpenTelemetry plumbing shared by the client and the server: the optional import, OTLP/HTTP
providers, and the GenAI semantic conventions' recommended histogram boundaries.

The SDK is an optional extra (`pip install 'itlbench[otel]'`); nothing imports it unless
`--otlp-endpoint` is given. Providers are private (never the global ones), so a test process can
hold a client and a server side at once. The conventions' metric helpers set no buckets, so every
histogram passes the recommended boundaries as `explicit_bucket_boundaries_advisory`.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from itlbench import __version__
from itlbench.errors import ConfigError
from itlbench.load.clients.kclock import measure_offset
from itlbench.urls import check_http_url

# Recommended ExplicitBucketBoundaries of the GenAI metric conventions (semantic-conventions,
# docs/gen-ai/gen-ai-metrics.md).
DURATION_BUCKETS: tuple[float, ...] = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                       20.48, 40.96, 81.92)
TOKEN_USAGE_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864
TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                   5.0, 7.5, 10.0)
TPOT_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

PROVIDER = "itlbench"  # gen_ai.provider.name of the bundled server (a custom value, as the conventions allow)
INSTALL_HINT = "pip install 'itlbench[otel]'"
ABANDON_WAIT_S = 1.0  # after stopping the exporters, how long a shutdown past its limit may take to end


def check_endpoint(url: str | None, flag: str = "--otlp-endpoint") -> str | None:
    """The OTLP/HTTP base URL (e.g. http://127.0.0.1:4318), or a ConfigError naming the flag: a bad URL (port
    99999, an unclosed IPv6 bracket) is refused here, before `probe_collector` tries it."""
    if url is None:
        return None
    check_http_url(url, flag, f"e.g. {flag} http://127.0.0.1:4318")
    require_sdk(flag)
    base = url.rstrip("/")
    for suffix in ("/v1/traces", "/v1/metrics"):
        base = base.removesuffix(suffix)
    return base


def probe_collector(base: str, flag: str = "--otlp-endpoint", timeout_s: float = 3.0) -> None:
    """Fail before a run when nothing at the collector's address takes OTLP/HTTP: the SDK would retry each
    export batch in the background and print a warning for every try, and the spans would be lost anyway.
    A listening port is not enough: a gRPC port (4317), a UI or a proxy accepts the connection and then
    answers every batch with an error, so an empty export (a valid request with no spans) must get a 2xx."""
    parsed = urllib.parse.urlparse(base)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(flag, f"nothing answers at {base} ({exc.strerror or exc})",
                          "start the OTLP collector first, or leave the flag out") from None
    why = _empty_export_fails(f"{base}/v1/traces", timeout_s)
    if why is not None:
        raise ConfigError(flag, f"{base} is not an OTLP/HTTP collector ({base}/v1/traces: {why})",
                          "give the collector's OTLP/HTTP address, port 4318 (4317 is gRPC)")


def _empty_export_fails(url: str, timeout_s: float) -> str | None:
    """Why an empty ExportTraceServiceRequest to `url` was not accepted, or None where it was."""
    import http.client
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=b"", method="POST", headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        return f"no HTTP answer: {getattr(exc, 'reason', None) or exc or type(exc).__name__}"


def require_sdk(flag: str = "--otlp-endpoint") -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
        import opentelemetry.semconv  # noqa: F401
    except ImportError:
        raise ConfigError(flag, "needs the OpenTelemetry SDK, OTLP/HTTP exporter and semantic conventions",
                          INSTALL_HINT) from None


@dataclass
class OtelProviders:
    """A tracer and a meter exporting over OTLP/HTTP to `endpoint`."""

    endpoint: str
    tracer_provider: Any
    meter_provider: Any
    exporters: tuple[Any, ...] = ()  # the OTLP exporters, stopped outright where a shutdown runs out of time
    _shut: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def tracer(self, name: str) -> Any:
        return self.tracer_provider.get_tracer(name, __version__)

    def meter(self, name: str) -> Any:
        return self.meter_provider.get_meter(name, __version__)

    def shutdown(self) -> None:
        """Export everything still buffered, then stop the exporter threads; once (the run's end and the
        interpreter's exit both call it: the SDK's own exit hook logged "shutdown can only be called once")."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    def shutdown_within(self, timeout_s: float) -> bool:
        """`shutdown()`, waited for at most `timeout_s`; False where it had not finished. A collector gone
        mid-run makes the SDK retry every buffered batch with backoff, about 10 s apiece: a run's run.json,
        summary and report must not wait on that. Past the limit the exporters are stopped outright: the
        caller says the spans are lost, and a retry left running would log its failure seconds later, in the
        middle of whatever runs next (a sweep's next point, the end of a test session)."""
        done = threading.Event()

        def shut() -> None:
            self.shutdown()
            done.set()

        threading.Thread(target=shut, name="itlbench-otlp-shutdown", daemon=True).start()
        if done.wait(timeout_s):
            return True
        self._abandon()
        done.wait(ABANDON_WAIT_S)  # the retry's backoff ends at once; an export mid-request ends with its socket
        return False

    def _abandon(self) -> None:
        """Stop every exporter now: its retry loop sees the shutdown and drops the batch. The SDK's words for
        that stop are left out (see `_OwnStop`): the caller's one line says the spans are lost."""
        for exporter in self.exporters:
            logger = logging.getLogger(type(exporter).__module__)
            if not any(isinstance(f, _OwnStop) for f in logger.filters):
                logger.addFilter(_OwnStop())
            with contextlib.suppress(Exception):  # the SDK's own shutdown may be racing this one
                exporter.shutdown()


class _OwnStop(logging.Filter):
    """Drops the OTLP exporter's warnings about a stop itlbench made itself: the aborted retry, and the SDK's
    own shutdown finding the exporter already stopped. Every other record (a failed export) passes."""

    MESSAGES = frozenset({"Shutdown in progress, aborting retry.", "Exporter already shutdown, ignoring call",
                          "Exporter already shutdown, ignoring batch"})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.MESSAGES


def make_providers(endpoint: str, service_name: str, export_interval_s: float = 5.0) -> OtelProviders:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name, "service.version": __version__})
    spans = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    metrics = OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics")
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # ours below, once
    tracer_provider.add_span_processor(BatchSpanProcessor(spans, schedule_delay_millis=1000))
    reader = PeriodicExportingMetricReader(metrics, export_interval_millis=export_interval_s * 1000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
    providers = OtelProviders(endpoint, tracer_provider, meter_provider, (spans, metrics))
    atexit.register(providers.shutdown)  # what is still buffered goes out at exit, as the SDK's hook did
    return providers


class Clock:
    """perf_counter_ns (the run's clock) to epoch nanoseconds (the clock spans carry), through the offset
    read near that moment. Why not one offset from the start: a wall clock drifts from the monotonic one
    (NTP slews it; CI's VM gained 0.6 %), and a span stamped through a start-up offset lands, after an
    hour, 20 s from where the wall clock put it, and from where vLLM, which reads the wall clock, would
    (wall_clock.py maps spans back through the client's offsets of their moment). The offset is read at
    most every `refresh_ns`, on a call, and a time maps through the reading nearest it."""

    def __init__(self, wall: Callable[[], int] = time.time_ns, perf: Callable[[], int] = time.perf_counter_ns,
                 refresh_ns: int = 100_000_000, keep: int = 4096) -> None:
        self._wall, self._perf, self.refresh_ns, self.keep = wall, perf, refresh_ns, keep
        self._at: list[int] = []  # perf_counter_ns of each reading, ascending
        self._offsets: list[int] = []
        self._lock = threading.Lock()
        self._read()

    @property
    def offset_ns(self) -> int:
        """The latest reading of CLOCK_REALTIME − perf_counter_ns."""
        return self._offsets[-1]

    def _read(self) -> None:
        reading = measure_offset(self._wall, self._perf, samples=3)
        self._at.append(self._perf())
        self._offsets.append(reading.offset_ns)
        if len(self._at) > self.keep:  # a long-lived server: the oldest half goes
            del self._at[: self.keep // 2], self._offsets[: self.keep // 2]

    def epoch(self, perf_ns: int) -> int:
        with self._lock:
            if self._perf() - self._at[-1] >= self.refresh_ns:
                self._read()
            i = bisect.bisect_left(self._at, perf_ns)
            if i == len(self._at) or (i > 0 and perf_ns - self._at[i - 1] <= self._at[i] - perf_ns):
                i -= 1
            return perf_ns + self._offsets[i]
