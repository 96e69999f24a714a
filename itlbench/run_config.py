"""Everything one `itlbench run` needs, validated up front so bad flags fail before any load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from itlbench.engine.config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.workloads.build import check_load_shape


@dataclass
class RunConfig:
    workload: str = "chat"
    inject: str | None = None
    inject_max_tokens: int = 16
    streams: int | None = None  # None: 32 steady streams, or 0 with --rate / trace replay
    rate: float | None = None
    burstiness: float = 1.0
    duration_s: float = 60.0
    warmup_s: float = 5.0  # at least this long
    adaptive_warmup: bool = True  # ...and until every closed-loop stream has received a token
    max_warmup_s: float = 300.0
    ramp_s: float = 0.0  # spread the streams' first sends over this many seconds
    drain_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    seed: int = 0
    out: Path | None = None
    reports_dir: Path = Path("reports")
    endpoint: str | None = None  # None: start the bundled engine
    model: str | None = None
    api_key: str | None = None
    api: str = "completions"  # completions | chat
    forced_lengths: bool = True  # send ignore_eos + min_tokens so output lengths are exact
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: str | None = None
    stall_factor: float = 5.0
    stall_floor_s: float = 0.05
    trace: Path | None = None
    time_scale: float = 1.0
    workers: int = 1
    live: bool = True
    stream_reader: str = "auto"  # auto | kernel | aiohttp (load/kernel_client.select_reader)
    metrics_port: str | None = None  # serve itlbench_client_* for Prometheus: "9464" or "HOST:9464"
    otlp_endpoint: str | None = None  # OTLP/HTTP base URL for spans and GenAI metrics (client and bundled server)

    def validate(self) -> None:
        check_load_shape(self.streams, self.rate, self.burstiness, self.duration_s)
        if self.warmup_s < 0:
            raise ConfigError("--warmup", f"must be >= 0 seconds, got {self.warmup_s}")
        if self.ramp_s < 0:
            raise ConfigError("--ramp", f"must be >= 0 seconds, got {self.ramp_s}")
        if self.streams == 0 and self.rate is None and not self.inject and self.workload != "trace":
            raise ConfigError("--streams", "0 streams, no --rate and no --inject sends nothing",
                              "give --streams N, --rate R or --inject SPEC")
        if self.endpoint is not None:
            if not self.endpoint.startswith(("http://", "https://")):
                raise ConfigError("--endpoint", f"{self.endpoint!r} is not an http(s) URL",
                                  "e.g. --endpoint http://127.0.0.1:8000/v1")
            if not self.model:
                raise ConfigError("--model", "is required with --endpoint",
                                  "give the served model name, as listed by GET /v1/models")
        if self.api not in ("completions", "chat"):
            raise ConfigError("--api", f"unknown API {self.api!r}", "use completions or chat")
        if self.workers < 1:
            raise ConfigError("--workers", f"must be >= 1, got {self.workers}")
        from itlbench.load.kernel_client import check_reader

        check_reader(self.stream_reader, self.endpoint)
        if self.stall_factor <= 1:
            raise ConfigError("--stall-factor", f"must be > 1, got {self.stall_factor}")
        if self.stall_floor_s < 0:
            raise ConfigError("--stall-floor", f"must be >= 0 seconds, got {self.stall_floor_s}")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale", f"must be > 0, got {self.time_scale}")
        if self.metrics_port is not None or self.otlp_endpoint is not None:
            from itlbench.telemetry.options import check_run_options

            check_run_options(self.metrics_port, self.otlp_endpoint, self.workers)
