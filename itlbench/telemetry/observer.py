"""Live telemetry of one run: the driver's observer, feeding Prometheus and/or OpenTelemetry.

The driver and client call this object (it is the `DriveObserver` of load/driver.py) only when
`--metrics-port` or `--otlp-endpoint` is given; without them they hold None and do nothing extra.
A telemetry fault is logged once and switches that part off: it never changes a measurement.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from itlbench.analysis.buckets import bucket_for
from itlbench.errors import ConfigError
from itlbench.load.sink import RowWriter
from itlbench.load.target import Target
from itlbench.telemetry.client_metrics import BOOLS, ClientMetrics
from itlbench.telemetry.live_stalls import RunningMedian, StallDetector
from itlbench.telemetry.metrics_server import MetricsServer, say
from itlbench.telemetry.options import parse_listen

log = logging.getLogger(__name__)
OTLP_CLOSE_S = 5.0  # the most the end of a run waits for the OTLP exporters (a healthy collector takes ms)
_now = time.perf_counter_ns


class _Watch:
    """Per-request state: its histogram children, the median of its gaps so far, its span."""

    __slots__ = ("ttft", "itl", "e2e", "gaps", "flag", "span")

    def __init__(self, children: tuple[Any, Any, Any], flag: str) -> None:
        self.ttft, self.itl, self.e2e = children
        self.gaps = RunningMedian()
        self.flag = flag
        self.span: Any = None


class LiveTelemetry:
    """`start()` it before the engine (a bad port fails first), `connect()` it to the target (then its URL is
    said), pass it to `drive(observer=...)` and the step follower (`tee`), and `close()` it at the end."""

    def __init__(self, metrics: ClientMetrics | None, providers: Any = None, *, stall_factor: float = 5.0,
                 stall_floor_s: float = 0.05) -> None:
        self.metrics = metrics
        self.providers = providers
        self.tracing: Any = None
        self.stalls = StallDetector(self._on_stall, factor=stall_factor, floor_s=stall_floor_s) if metrics else None
        self.metrics_url: str | None = None
        self._httpd: MetricsServer | None = None
        self._sent_any = False  # a request went out: there are final values a scraper may not have read

    # ---- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def start(cls, metrics_port: str | None, otlp_endpoint: str | None, *, stall_factor: float = 5.0,
              stall_floor_s: float = 0.05, workloads: Sequence[tuple[str, bool]] = ()) -> LiveTelemetry | None:
        """`workloads`: the (workload, injected) label pairs the plan sends, whose latency series are served
        at zero from the first scrape (see ClientMetrics.zero_workloads)."""
        if metrics_port is None and otlp_endpoint is None:
            return None
        providers = None
        if otlp_endpoint is not None:
            from itlbench.telemetry.otel import check_endpoint, make_providers

            providers = make_providers(check_endpoint(otlp_endpoint) or "", "itlbench-client")
        tel = cls(ClientMetrics() if metrics_port is not None else None, providers,
                  stall_factor=stall_factor, stall_floor_s=stall_floor_s)
        if metrics_port is not None:
            tel._serve(*parse_listen(metrics_port), workloads=workloads)
        return tel

    def _serve(self, host: str, port: int, workloads: Sequence[tuple[str, bool]] = ()) -> None:
        assert self.metrics is not None
        self.metrics.zero_workloads(workloads)
        try:
            self._httpd = MetricsServer(host, port, self.metrics.registry)
        except OSError as exc:
            raise ConfigError("--metrics-port", f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                              _listen_hint(exc)) from None
        self.metrics_url = self._httpd.url

    def connect(self, target: Target, *, has_steps: bool, provider_name: str, run_info: dict[str, str]) -> None:
        """Bind to the target once it is known: span attributes, run info, step-log availability. The metrics URL
        is said here, not where the port was taken: a run whose server or plan fails says only why."""
        if self.metrics_url is not None:
            say(f"client metrics for Prometheus: {self.metrics_url}")
        if self.metrics is not None and self.stalls is not None:
            self.metrics.set_run_info(**run_info)
            self.stalls.has_steps = has_steps
        if self.providers is not None:
            from itlbench.telemetry.client_tracing import ClientTracing

            self.tracing = ClientTracing(self.providers, target, provider_name)

    def close(self, linger: bool = True) -> None:
        """Settle the last stalls, let a scraper read the final values, stop serving, export what the OTLP
        exporters still hold. `linger`: where something has scraped /metrics, keep serving until a scrape
        begun after this call has been answered, at most about one scrape interval (see `MetricsServer`);
        not where no request was ever sent (a run that failed before its load)."""
        if self.stalls is not None:
            self.stalls.settle(_now(), final=True)
        if self._httpd is not None:
            if linger and self._sent_any:
                self._httpd.linger()
            self._httpd.stop()
            self._httpd = None
        if self.providers is not None:
            if not self.providers.shutdown_within(OTLP_CLOSE_S):
                say(f"the OTLP collector at {self.providers.endpoint} did not take the run's last spans and metrics "
                    f"within {OTLP_CLOSE_S:g} s: they are lost (the run's records are complete)")
            self.providers = None

    def doc(self) -> dict[str, str | None]:
        return {"metrics_url": self.metrics_url,
                "otlp_endpoint": self.providers.endpoint if self.providers is not None else None}

    # ---- the driver's observer hooks (event loop) ----------------------------------------------
    def on_start(self, ex: Any) -> dict[str, str] | None:
        now = _now()
        self._sent_any = True
        plan = ex.plan
        flag = BOOLS[plan.injected]
        m = self.metrics
        w = _Watch(m.children(plan, bucket_for(plan.prompt_tokens)) if m is not None else (None, None, None), flag)
        ex.watch = w
        if m is not None:
            m.sent.labels(flag).inc()
            m.in_flight.labels(flag).inc()
            m.prompt_tokens.inc(plan.prompt_tokens)
            m.send_lag.observe((now - ex.scheduled_ns) / 1e9)
        if self.tracing is not None:
            try:
                w.span, headers = self.tracing.start(ex, now)
                return headers
            except Exception:  # noqa: BLE001 - tracing must never fail a request
                log.exception("tracing failed; spans switched off")
                self.tracing = None
        return None

    def on_chunk(self, ex: Any, t_ns: int, n_tokens: int) -> None:
        m = self.metrics
        if m is None:
            return
        try:
            m.output_tokens.inc(n_tokens)
            w: _Watch = ex.watch
            times = ex.times
            if len(times) == 1:
                w.ttft.observe((t_ns - ex.scheduled_ns) / 1e9)
                return
            prev = times[-2]
            gap = t_ns - prev
            w.itl.observe(gap / 1e9)
            m.itl_max.add(t_ns, gap)
            w.gaps.add(gap)
            stalls = self.stalls
            if stalls is not None and stalls.is_stall(w.gaps, gap):
                stalls.flag(prev, t_ns)
        except Exception:  # noqa: BLE001 - telemetry must never fail a request
            log.exception("client metrics failed; switched off")
            self.metrics = None

    def on_end(self, ex: Any, done_ns: int) -> None:
        w: _Watch | None = ex.watch
        m = self.metrics
        plan = ex.plan
        if m is not None:
            flag = BOOLS[plan.injected]
            m.requests.labels(ex.status, flag).inc()
            if w is not None:
                m.in_flight.labels(flag).dec()
                if ex.status == "ok":
                    w.e2e.observe((done_ns - ex.scheduled_ns) / 1e9)
        if w is not None and w.span is not None and self.tracing is not None:
            try:
                self.tracing.end(w.span, ex, done_ns)
            except Exception:  # noqa: BLE001
                log.exception("tracing failed; spans switched off")
                self.tracing = None

    def on_sample(self, row: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.loop_lag.set(row["loop_lag_s"])
            self.metrics.cpu.set(row["cpu_percent"])
        if self.stalls is not None:
            self.stalls.settle(row["t_ns"])

    def on_pause(self, row: dict[str, Any]) -> None:
        if self.stalls is not None:
            self.stalls.add_pause(int(row["start_ns"]), int(row["end_ns"]))  # type: ignore[arg-type]

    def tee(self, writer: RowWriter) -> RowWriter:
        """A writer for the step follower that also hands each step to the stall detector."""
        return _StepTap(writer, self.stalls) if self.stalls is not None else writer

    def _on_stall(self, cause: str, gap_s: float) -> None:
        if self.metrics is not None:
            self.metrics.stall(cause, gap_s)


def _listen_hint(exc: OSError) -> str:
    """The fix for a failed bind: a port in use wants another port, an address not on this machine (a typo,
    another host's IP) wants a local one; "choose a free port" sent the latter looking for the wrong thing."""
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
        return "use an address of this machine: 127.0.0.1, or 0.0.0.0 to expose it"
    if exc.errno == errno.EACCES:
        return "use a port above 1023 (e.g. 9464)"
    return "choose a free port (0 picks one)"


class _StepTap:
    def __init__(self, writer: RowWriter, stalls: StallDetector) -> None:
        self.writer, self.stalls = writer, stalls

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.writer.add(table, row)
        if table == "steps":
            self.stalls.add_step(int(row["start_ns"]), int(row["end_ns"]), int(row.get("prefill_tokens") or 0),
                                 int(row.get("num_preemptions") or 0))
