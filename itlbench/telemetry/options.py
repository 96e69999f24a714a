"""The live-telemetry flags of `itlbench run` and `itlbench serve`, checked before anything starts."""

from __future__ import annotations

from itlbench.errors import ConfigError

DEFAULT_METRICS_HOST = "127.0.0.1"


def parse_listen(text: str, flag: str = "--metrics-port") -> tuple[str, int]:
    """`9464` (loopback) or `HOST:9464` (e.g. 0.0.0.0:9464 inside a container) → (host, port); port 0
    picks a free one."""
    host, sep, port_text = str(text).strip().rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_METRICS_HOST
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535 or (sep and not host):
        raise ConfigError(flag, f"{text!r} is not a port or HOST:PORT", "e.g. --metrics-port 9464 or 0.0.0.0:9464")
    return host, port


def check_run_options(metrics_port: str | None, otlp_endpoint: str | None, workers: int) -> None:
    if metrics_port is not None:
        parse_listen(metrics_port)
    if otlp_endpoint is not None:
        from itlbench.telemetry.otel import check_endpoint

        check_endpoint(otlp_endpoint)
    if workers > 1 and (metrics_port is not None or otlp_endpoint is not None):
        flag = "--metrics-port" if metrics_port is not None else "--otlp-endpoint"
        raise ConfigError(flag, f"live telemetry is not available with --workers {workers}",
                          "run one client process (--workers 1) to watch it live")
