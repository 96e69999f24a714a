"""Everything one `itlbench run` needs, validated up front so bad flags fail before any load."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itlbench.core.engine_config import EngineConfig, flag_of
from itlbench.errors import ConfigError
from itlbench.load.clients.limits import Limits
from itlbench.units import check_finite
from itlbench.urls import check_http_url
from itlbench.workloads.build import check_load_shape

if TYPE_CHECKING:
    from itlbench.workloads.trace import Trace

PROMPT_FORMATS = ("auto", "ids", "text")

WARMUP_WAIT_S = 60.0  # the adaptive warm-up waits at most this long past --warmup for a first token
LOCUST_UI_PORT = 8089  # --locust-ui-port's default
MAX_SEED = 2**64 - 1  # --seed: numpy's generators take no negative seed, torch's none past this

# What to do once a run has passed its checks, before it prints anything (None: nothing; see after_checks).
_AFTER_CHECKS: ContextVar[Callable[[], None] | None] = ContextVar("itlbench_after_checks", default=None)


@contextlib.contextmanager
def after_checks(then: Callable[[], None]) -> Iterator[None]:
    """Within it, a run calls `then` once its input is checked (`checks_passed`): a sweep holds its first banner
    until then, so options its first run refuses read as one line, not as a point that started."""
    token = _AFTER_CHECKS.set(then)
    try:
        yield
    finally:
        _AFTER_CHECKS.reset(token)


def checks_passed() -> None:
    """Called by `itlbench run` when its input is checked and nothing has started yet."""
    if (then := _AFTER_CHECKS.get()) is not None:
        then()


@dataclass(frozen=True)
class CheckedRun:
    """What checking a run found (`orchestrate.check_run`): the run directory to make, and the trace the
    run replays as the check read it (None: no trace workload), so the run never reads the file again."""

    run_dir: Path
    trace: Trace | None = None


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
    max_warmup_s: float = 300.0  # the adaptive warm-up's hard cap (see warmup_limit_s)
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
    scrape_interval_s: float = 0.0  # external /metrics: 0 = only at the window's start and end
    reuse_prompts: bool = False  # False: a per-run salt makes every prompt new to a prefix cache
    prompt_format: str = "auto"  # auto | ids | text (external endpoints; the bundled engine takes ids)
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: str | None = None
    stall_factor: float = 5.0
    stall_floor_s: float = 0.05
    trace: Path | None = None
    time_scale: float = 1.0
    workers: int = 1
    live: bool = True
    stream_reader: str = "auto"  # auto | kernel | aiohttp (load/kernel_client.select_reader)
    driver: str = "aiohttp"  # aiohttp | locust
    master_bind: str | None = None  # locust: the master listens here for workers started by hand
    locust_ui: bool = False  # locust: serve Locust's web UI
    locust_ui_port: int = LOCUST_UI_PORT
    metrics_port: str | None = None  # serve itlbench_client_* for Prometheus: "9464" or "HOST:9464"
    otlp_endpoint: str | None = None  # OTLP/HTTP base URL for spans and GenAI metrics (client and bundled server)
    limits: Limits = field(default_factory=Limits)  # caps on what a server may make the client hold (--limits)
    extra_body: dict[str, Any] = field(default_factory=dict)  # fields added to every request (--extra-body)
    clock: str = "auto"  # auto | virtual | real: the simulator in-process on a virtual clock, or served (resolve_clock below)
    receive_otlp: bool = False  # --receive-otlp given: an external server's request spans are received (check_receive_otlp)

    @property
    def warmup_limit_s(self) -> float:
        """How long the adaptive warm-up waits for every stream's first token: --warmup plus at most a minute
        (less with a shorter --request-timeout, after which the request fails and its stream sends anew), so a
        first token that never comes delays the window by a minute, not silently by five."""
        return min(self.max_warmup_s, self.warmup_s + min(WARMUP_WAIT_S, self.request_timeout_s))

    @property
    def virtual_clock(self) -> bool:
        """True when the run drives the simulator in-process on a virtual clock (resolve_clock below)."""
        return resolve_clock(self) == "virtual"

    def validate(self) -> None:
        check_finite(self, lambda name: flag_of(name.removesuffix("_s")))
        self.engine.validate()
        check_load_shape(self.streams, self.rate, self.burstiness, self.duration_s)
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("--seed", f"must be a whole number from 0 to 2**64 - 1, got {self.seed}", "e.g. --seed 0")
        self._refuse_unused()
        if self.warmup_s < 0:
            raise ConfigError("--warmup", f"must be >= 0 seconds, got {self.warmup_s}")
        if self.request_timeout_s <= 0:
            raise ConfigError("--request-timeout", f"must be > 0 seconds, got {self.request_timeout_s}")
        if self.ramp_s < 0:
            raise ConfigError("--ramp", f"must be >= 0 seconds, got {self.ramp_s}")
        if self.streams == 0 and self.rate is None and not self.inject and self.workload != "trace":
            raise ConfigError("--streams", "0 streams, no --rate and no --inject sends nothing",
                              "give --streams N, --rate R or --inject SPEC")
        if self.endpoint is not None:
            check_http_url(self.endpoint, "--endpoint", "e.g. --endpoint http://127.0.0.1:8000/v1")
        if self.endpoint is None and self.prompt_format == "text":
            raise ConfigError("--prompt-format", "the bundled engine is always sent token-id prompts",
                              "drop --prompt-format text, or measure a server given with --endpoint")
        if self.endpoint is None and self.api == "chat":
            raise ConfigError("--api", "the bundled engine is sent token-id prompts through the completions API "
                              "(exact prompt lengths); chat messages are text", "drop --api chat, or serve it "
                              "(itlbench serve) and measure it with --endpoint URL --api chat")
        if self.endpoint is None and self.scrape_interval_s > 0:
            raise ConfigError("--scrape-interval", "only an --endpoint's /metrics is scraped",
                              "drop it: the bundled engine's step log is read instead")
        if self.api not in ("completions", "chat"):
            raise ConfigError("--api", f"unknown API {self.api!r}", "use completions or chat")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ConfigError("--prompt-format", f"unknown format {self.prompt_format!r}",
                              "use auto (token ids where the server takes them), ids or text")
        if self.prompt_format == "ids" and self.api == "chat":
            raise ConfigError("--prompt-format", "token-id prompts need the completions API",
                              "drop --api chat, or use --prompt-format text")
        if self.scrape_interval_s < 0:
            raise ConfigError("--scrape-interval", f"must be >= 0 seconds, got {self.scrape_interval_s}",
                              "0 reads /metrics only at the window's start and end; e.g. 5s adds periodic scrapes")
        if self.workers < 1:
            raise ConfigError("--workers", f"must be >= 1, got {self.workers}",
                              "1 drives the load from this process; N > 1 spreads the streams over N processes")
        from itlbench.load.clients.kernel import check_reader

        check_reader(self.stream_reader, self.endpoint)
        if self.stall_factor <= 1:
            raise ConfigError("--stall-factor", f"must be > 1, got {self.stall_factor}",
                              "a stall is a gap this many times its stream's median; the default is 5")
        if self.stall_floor_s < 0:
            raise ConfigError("--stall-floor", f"must be >= 0 seconds, got {self.stall_floor_s}",
                              "the shortest gap a stall can be; the default is 50ms")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale", f"must be > 0, got {self.time_scale}",
                              "2 replays the trace twice as fast, 0.5 at half speed; 1 as recorded")
        if self.metrics_port is not None or self.otlp_endpoint is not None:
            from itlbench.telemetry.options import check_run_options

            check_run_options(self.metrics_port, self.otlp_endpoint, self.workers)
        self._validate_driver()
        _ = self.virtual_clock  # an impossible --clock fails here, before anything starts
        if self.receive_otlp:
            check_receive_otlp(self)

    def _refuse_unused(self) -> None:
        """A load flag set away from its default that this run would ignore is refused, like the engine's."""
        if self.burstiness != 1.0 and self.rate is None:
            raise ConfigError("--burstiness", "only shapes --rate arrivals", "add --rate R or drop --burstiness")
        if self.time_scale != 1.0 and self.workload != "trace":
            raise ConfigError("--time-scale", "only applies to a trace replay",
                              "add --workload trace --trace FILE or drop --time-scale")

    def _validate_driver(self) -> None:
        if self.driver not in ("aiohttp", "locust"):
            raise ConfigError("--driver", f"unknown driver {self.driver!r}", "use aiohttp or locust")
        ui_port = self.locust_ui_port != LOCUST_UI_PORT  # set away from the default: read only with the web UI
        if self.driver != "locust":
            for flag, given in (("--master-bind", self.master_bind is not None), ("--locust-ui", self.locust_ui),
                                ("--locust-ui-port", ui_port)):
                if given:
                    raise ConfigError(flag, "only applies to --driver locust", "add --driver locust or drop it")
            return
        if ui_port and not self.locust_ui:
            raise ConfigError("--locust-ui-port", "is the port of Locust's web UI, which only --locust-ui serves",
                              "add --locust-ui or drop --locust-ui-port")
        for flag, given in (("--metrics-port", self.metrics_port), ("--otlp-endpoint", self.otlp_endpoint)):
            if given is not None:
                raise ConfigError(flag, "live telemetry is not available with --driver locust yet",
                                  "use Locust's web UI (--locust-ui), or drop --driver locust")
        from itlbench.load.locust import require_locust
        from itlbench.load.locust.job import parse_host_port

        if self.master_bind is not None:
            parse_host_port(self.master_bind, "--master-bind")
        if not 0 <= self.locust_ui_port < 65536:
            raise ConfigError("--locust-ui-port", f"{self.locust_ui_port} is not a port", "e.g. 8089, or 0 for a free one")
        require_locust()


def check_receive_otlp(cfg: RunConfig) -> None:
    """--receive-otlp takes the request spans of a server given with --endpoint (vLLM's `llm_request` spans, which
    `analyze --attribution otel` reads). Without --endpoint itlbench runs the bundled engine itself, whose step log
    the run already records step by step, so it is refused up front rather than waited on for spans that never
    come: the in-process simulator has no server to send any, and the bundled server's own spans (not vLLM's)
    go to an OTLP collector with --otlp-endpoint."""
    if cfg.endpoint is not None:
        return
    if cfg.virtual_clock:
        raise ConfigError("--receive-otlp", "the simulator runs in this process on a virtual clock: no server runs, "
                          "so none sends spans (the run records the simulated engine's steps themselves)",
                          "drop --receive-otlp, or use it with --endpoint URL, a server that exports spans "
                          "(vLLM started with --otlp-traces-endpoint)")
    raise ConfigError("--receive-otlp", "receives the spans of a server given with --endpoint (vLLM's "
                      "--otlp-traces-endpoint); the bundled engine itlbench starts here has its step log recorded "
                      "instead", "drop --receive-otlp, or send the bundled server's own spans to an OTLP collector "
                      "with --otlp-endpoint URL")


# fields itlbench itself sets on every request: --extra-body may not change what the run means
_OWN_FIELDS = ("model", "prompt", "messages", "stream", "stream_options", "max_tokens")


def _not_a_number(word: str) -> float:
    """NaN and Infinity, which Python's reader takes and no JSON body can carry (the run died writing run.json)."""
    raise ValueError(f"{word} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is past a float's range")
    return value


def parse_extra_body(text: str | None) -> dict[str, Any]:
    """`--extra-body '{"logprobs": 1}'`: a JSON object merged into each request (like vllm bench's)."""
    if not text:
        return {}
    try:
        doc = json.loads(text, parse_constant=_not_a_number, parse_float=_finite)
    except ValueError as exc:
        raise ConfigError("--extra-body", f"is not JSON ({exc})", """give a JSON object, e.g. '{"logprobs": 1}'""") from None
    except RecursionError:
        raise ConfigError("--extra-body", "is nested too deeply to read", """give a JSON object, e.g. '{"logprobs": 1}'""") from None
    if not isinstance(doc, dict):
        raise ConfigError("--extra-body", "must be a JSON object", """e.g. '{"logprobs": 1}'""")
    own = sorted(set(doc) & set(_OWN_FIELDS))
    if own:
        raise ConfigError("--extra-body", f"sets {', '.join(own)}, which the workload decides",
                          "use --workload, --api and the load flags for those")
    return doc


# Which clock a run's simulated engine runs on (`itlbench run --clock`).
# virtual: the engine in-process on a discrete-event clock (harness.virtual_run): each step moves time by
# its predicted duration and nothing sleeps, so minutes of simulated load take seconds. real: the
# bundled server paces the simulator in real time and the load driver measures it over HTTP like any
# engine (client, network and server included). auto, the default, is virtual for the simulator
# unless the run asks for something only the served path has, and real for every other engine.
CLOCKS = ("auto", "virtual", "real")


def served_only(cfg: RunConfig) -> list[str]:
    """The flags of `cfg` that need the served, real-time path (a client, a server, wall time)."""
    needs = [("--disaggregate", cfg.engine.disaggregate), ("--sim-time-scale", cfg.engine.sim_time_scale != 1),
             ("--workers", cfg.workers > 1), ("--driver locust", cfg.driver == "locust"),
             ("--metrics-port", cfg.metrics_port is not None), ("--otlp-endpoint", cfg.otlp_endpoint is not None)]
    return [flag for flag, given in needs if given]


def resolve_clock(cfg: RunConfig) -> str:
    """'virtual' or 'real' for this run; a clock the run cannot have is a ConfigError naming --clock."""
    if cfg.clock not in CLOCKS:
        raise ConfigError("--clock", f"unknown clock {cfg.clock!r}", "use auto, virtual or real")
    simulated = cfg.endpoint is None and cfg.engine.engine == "sim"
    if cfg.clock == "real" or (cfg.clock == "auto" and not simulated):
        return "real"
    if not simulated:
        raise ConfigError("--clock", "virtual time needs the bundled simulator",
                          "add --engine sim (and drop --endpoint), or use --clock real")
    served = served_only(cfg)
    if served and cfg.clock == "virtual":
        raise ConfigError("--clock", f"{', '.join(served)} needs the served simulator in real time",
                          "use --clock real (or auto), or drop " + served[0])
    return "real" if served else "virtual"
