"""`--receive-otlp`: collect a server's request spans during a run, into RUN/otel_spans.jsonl.

Why: vLLM exports one `llm_request` span per finished request when started with
`--otlp-traces-endpoint URL` (and `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`); those spans are
what `itlbench analyze --attribution otel` attributes stalls on. Without this a user needed a collector
or Python to get them. `itlbench run`, `sweep` and `capacity` take `--receive-otlp [HOST:]PORT` (or
`auto`: a free loopback port), start an in-process OTLP/HTTP receiver for the whole command, fill
`{otlp_endpoint}` in a `--serve` template with its traces URL, and after each run write the run's own
spans (`spans_for_run`: those that arrived between the run's start and end) to the run directory and
record them in run.json under `otel_spans`.

Exporters batch: vLLM's (the OpenTelemetry SDK's BatchSpanProcessor) sends every 5 s, so the last
requests' spans arrive after the run has ended. `save` waits until every request the run finished has
a span, or `wait_s` (default 10 s) has passed, whichever is first; run.json says how many came.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from itlbench.errors import ConfigError

FLAG = "--receive-otlp"
WAIT_S = 10.0  # > the SDK's 5 s batch delay, with room for one slow export
_WILDCARD = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class ReceiveSpec:
    """Where the receiver listens: `HOST:PORT`, `PORT` (loopback) or `auto` (a free loopback port)."""

    host: str = "127.0.0.1"
    port: int = 0

    @classmethod
    def parse(cls, value: str, flag: str = FLAG) -> ReceiveSpec:
        text = value.strip()
        if text.lower() == "auto":
            return cls()
        host, _, port = text.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            number = int(port)
        except ValueError:
            number = -1
        if not 0 <= number <= 65535 or "/" in host:
            raise ConfigError(flag, f"{value!r} is not PORT, HOST:PORT or auto",
                              f"e.g. {flag} 4318 (then give the server --otlp-traces-endpoint "
                              "http://127.0.0.1:4318/v1/traces), or auto with a --serve template's {otlp_endpoint}")
        return cls(host, number)


def parse_receive(value: str | None, flag: str = FLAG) -> ReceiveSpec | None:
    return None if value is None else ReceiveSpec.parse(value, flag)


def _require_proto(flag: str) -> None:
    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
    except ImportError:
        raise ConfigError(flag, "needs the OTLP protobuf messages (opentelemetry-proto)",
                          "pip install 'itlbench[otel]'") from None


class SpanCapture:
    """`with SpanCapture(spec) as cap:` → `cap.traces_url` for the server; `cap.save(run_dir)` after each run."""

    def __init__(self, spec: ReceiveSpec, flag: str = FLAG) -> None:
        _require_proto(flag)
        from itlbench.telemetry.otlp_receiver import OtlpReceiver

        try:
            self.receiver = OtlpReceiver(spec.host, spec.port)
        except OSError as exc:
            raise ConfigError(flag, f"cannot listen on {spec.host}:{spec.port} ({exc.strerror or exc})",
                              "choose a free port, or auto") from None

    @property
    def base_url(self) -> str:
        host, port = self.receiver.server.server_address[:2]
        host = "127.0.0.1" if host in _WILDCARD else str(host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def traces_url(self) -> str:
        """What vLLM's `--otlp-traces-endpoint` takes (an explicit endpoint is used as given, path and all)."""
        return self.base_url + "/v1/traces"

    def __enter__(self) -> SpanCapture:
        self.receiver.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.receiver.stop()

    def save(self, run_dir: Path, wait_s: float = WAIT_S, poll_s: float = 0.2) -> dict[str, Any] | None:
        """Write the run's spans to RUN/otel_spans.jsonl and record them in run.json (None: no run.json)."""
        from itlbench.analysis.otel_attribution import SPAN_NAME, SPANS_FILE, run_bounds, write_spans

        path = Path(run_dir, "run.json")
        if not path.is_file():
            return None
        lo, hi = run_bounds(run_dir)
        expected = _finished_requests(run_dir)
        t0 = time.monotonic()
        while True:
            spans = [s for s in self.receiver.received.snapshot()[0] if lo <= int(s.get("start_ns") or 0) <= hi]
            requests = sum(1 for s in spans if s.get("name") == SPAN_NAME)
            if requests >= expected or time.monotonic() - t0 >= wait_s:
                break
            time.sleep(poll_s)
        kept = write_spans(Path(run_dir, SPANS_FILE), spans)
        record = {"file": SPANS_FILE, "endpoint": self.traces_url, "spans": kept, "request_spans": requests,
                  "finished_requests": expected, "waited_s": round(time.monotonic() - t0, 3),
                  "received_total": self.receiver.received.requests}
        doc = json.loads(path.read_text())
        doc["otel_spans"] = record
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        self.receiver.received.drop_spans_until(hi)
        return record


def _finished_requests(run_dir: Path) -> int:
    """Requests the run sent and the server finished (each should have one span)."""
    import polars as pl

    from itlbench.rundir.reader import read_table

    requests = read_table(run_dir, "requests")
    return int(requests.filter(pl.col("status") == "ok").height)


def missing_line(record: dict[str, Any] | None) -> str | None:
    """A warning when the server sent fewer request spans than the run finished requests (None: all came)."""
    if not record or record["request_spans"] >= record["finished_requests"]:
        return None
    if record["spans"] == 0:
        return (f"no spans reached {record['endpoint']} during the run: start the server with "
                f"--otlp-traces-endpoint {record['endpoint']} and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf")
    return (f"{record['request_spans']} request spans for {record['finished_requests']} finished requests "
            f"(after waiting {record['waited_s']:g} s); the otel attribution matches those that came")


@contextlib.contextmanager
def capture(value: str | None, say: Callable[[str], None] = lambda s: None,
            flag: str = FLAG) -> Iterator[SpanCapture | None]:
    """The receiver for a command's `--receive-otlp VALUE` (None when not given), listening until the block ends."""
    spec = parse_receive(value, flag)
    if spec is None:
        yield None
        return
    with SpanCapture(spec, flag) as cap:
        say(f"receiving OTLP spans at {cap.traces_url}")
        yield cap


def save_and_warn(cap: SpanCapture | None, run_dir: Path, say: Callable[[str], None]) -> None:
    """After a run: its spans into its directory, and a line when fewer came than it finished requests."""
    if cap is None:
        return
    line = missing_line(cap.save(run_dir))
    if line:
        say(f"warning: {line}")
