"""A Locust run's job: what every process of it (launcher, master, workers) must agree on.

The job says which plan to build (a seeded factory every worker calls itself, so only its name and
arguments cross the wire; the launcher's local workers are handed the trace it replays: `trace_file`),
where to send, and the timeline (warmup, duration, drain). It also holds the message names master and
workers exchange and the master's warmup gate. This module imports no locust: `import locust`
monkey-patches the whole process with gevent, so only the master and worker processes may import it,
never the itlbench CLI.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from itlbench.errors import ConfigError
from itlbench.load.driver import Warmup
from itlbench.load.locust.auth import WORKER_KEY_ENV, check_factory
from itlbench.load.target import Target
from itlbench.rundir.schema import TABLES, coerce_row
from itlbench.workloads.build import LoadSpec, build_load_plan
from itlbench.workloads.plan import LoadPlan
from itlbench.workloads.trace import Trace

# Messages (Locust's custom message channel). Master -> worker:
MSG_JOB = "itlbench_job"  # {k, n, job, master_host, master_boot}: your share of the run
MSG_GRANT = "itlbench_grant"  # {nonce, stream}: the closed-loop stream a user runs (None: none left)
MSG_GO = "itlbench_go"  # {run_start_ns, measure_start_ns?, end_ns?} on the master clock
MSG_WINDOW = "itlbench_window"  # {measure_start_ns, end_ns}: the adaptive warmup ended
MSG_STOP = "itlbench_stop"  # {reason}: stop sending now, cancel in-flight requests
MSG_PONG = "itlbench_pong"  # {t0, t_master}: clock-offset probe answer
# Worker -> master:
MSG_READY = "itlbench_ready"  # {k, host, pid, offset_ns, process: roster.process_identity()}
MSG_CLAIM = "itlbench_claim"  # {k, nonce}
MSG_PING = "itlbench_ping"  # {k, t0}
MSG_FIRST_TOKEN = "itlbench_first_token"  # {k, stream, t_ns}
MSG_ROWS = "itlbench_rows"  # {k, tables: {table: {column: [values]}}, progress?}
MSG_DONE = "itlbench_done"  # {k, result}
MSG_FAILED = "itlbench_failed"  # {k, error}: the worker could not take its share (e.g. no trace file there)

API_KEY_ENV = WORKER_KEY_ENV  # how the launcher hands local workers the bearer key (off disk, off the wire)
RESULT_FILE = "locust_result.json"  # what the master leaves in the run directory
LOG_FILE = "locust.log"  # master and local workers' output
DEFAULT_FACTORY = "itlbench.load.locust.job:plan_from_spec"


def plan_from_spec(*, trace: Trace | None = None, **spec: Any) -> LoadPlan:
    """The default plan factory: `build_load_plan` of a LoadSpec given as its fields. `trace`: the trace the
    spec replays, already read (`trace_file`: the launcher's, handed over; None: read here)."""
    if trace is not None and not isinstance(trace, Trace):  # never from the job: only a worker's own file
        raise ConfigError("plan_kwargs", "'trace' is not a field of the load", "remove it from the job")
    if "reserved_ids" in spec:
        spec["reserved_ids"] = tuple(spec["reserved_ids"])
    if isinstance(spec.get("inject"), list):
        spec["inject"] = tuple(spec["inject"])
    return build_load_plan(LoadSpec(**spec), trace=trace)


def spec_kwargs(spec: LoadSpec) -> dict[str, Any]:
    """LoadSpec as JSON-able arguments of `plan_from_spec`."""
    return json.loads(json.dumps(asdict(spec), default=str))


def boot_id() -> str | None:
    """This boot's id (Linux): two processes with the same one share CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def parse_host_port(text: str, flag: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(flag, f"{text!r} is not HOST:PORT", "e.g. 0.0.0.0:5557")
    return host, int(port)


def rows_from_columns(table: object, cols: object) -> list[dict[str, Any]] | None:
    """A worker's column-wise batch as rows of `table`, every value coerced (a worker is a peer:
    strings str, counts non-negative int64, else null). None: not a batch of a known table (not a
    dict of equal-length lists), to be counted as dropped by the caller."""
    if not isinstance(table, str) or table not in TABLES or not isinstance(cols, dict) or not cols:
        return None
    columns = [v for v in cols.values()]
    if not all(isinstance(v, list) for v in columns) or len({len(v) for v in columns}) != 1:
        return None
    keys = [str(k) for k in cols]
    rows = [coerce_row(table, dict(zip(keys, values, strict=True))) for values in zip(*columns, strict=True)]
    return [r for r in rows if r is not None]


@dataclass
class LocustJob:
    """One distributed run. `master_bind` None: master on loopback with `workers` local processes;
    else the master binds there and waits for `workers` workers started by hand."""

    target: dict[str, Any]
    run_dir: str
    duration_s: float
    warmup: dict[str, Any] = field(default_factory=lambda: asdict(Warmup()))
    drain_timeout_s: float = 30.0
    workers: int = 1
    plan_factory: str = DEFAULT_FACTORY
    plan_kwargs: dict[str, Any] = field(default_factory=dict)
    master_bind: str | None = None
    locust_ui: bool = False
    locust_ui_port: int = 8089
    max_connection_errors: int = 50
    sample_interval_s: float = 0.5
    batch_interval_s: float = 0.2
    worker_wait_s: float = 120.0  # how long the master waits for its workers to connect
    streams: int | None = None  # the plan's closed-loop streams, as the launcher built it (None: the master builds it)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("--workers", f"must be >= 1, got {self.workers}")
        if self.duration_s <= 0:
            raise ConfigError("--duration", f"must be > 0 seconds, got {self.duration_s}")
        if self.master_bind is not None:
            parse_host_port(self.master_bind, "--master-bind")
        check_factory(self.plan_factory)
        if self.streams is not None and (isinstance(self.streams, bool) or not isinstance(self.streams, int)
                                         or self.streams < 0):
            raise ConfigError("streams", f"must be a count of streams, got {self.streams!r}", "e.g. 32, or leave it out")

    @classmethod
    def for_plan(cls, target: Target, run_dir: str | Path, *, duration_s: float, warmup: Warmup | None = None,
                 factory: str = DEFAULT_FACTORY, plan_kwargs: dict[str, Any] | None = None,
                 **kw: Any) -> LocustJob:
        return cls(target=asdict(target), run_dir=str(run_dir), duration_s=duration_s,
                   warmup=asdict(warmup or Warmup()), plan_factory=factory, plan_kwargs=dict(plan_kwargs or {}),
                   **kw)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LocustJob:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def build_target(self) -> Target:
        return Target(**self.target)

    def build_warmup(self) -> Warmup:
        return Warmup(**self.warmup)

    def build_plan(self, trace: Trace | None = None) -> LoadPlan:
        """Call the factory (`module:function`, one of `auth.ALLOWED_FACTORIES`: the name may come from
        the wire); every worker gets the same seeded plan. `trace`: the replayed trace as the launcher read
        it (`trace_file`), for a factory that replays one."""
        check_factory(self.plan_factory)
        module, _, name = self.plan_factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        kwargs = json.loads(json.dumps(self.plan_kwargs))
        return factory(**kwargs) if trace is None else factory(**kwargs, trace=trace)

    def closed_streams(self) -> int:
        """How many closed-loop streams the plan has: the launcher's count, else the plan's own."""
        return self.streams if self.streams is not None else len(self.build_plan().streams)


@dataclass
class WarmupGate:
    """When measurement starts, decided by the master as the aiohttp driver decides it alone: not
    before `min_s` after the start, and (adaptive) not before every closed-loop stream has received
    a token, but never later than `max_s`. Times are master-clock perf_counter_ns."""

    warmup: Warmup
    run_start_ns: int
    streams: int
    duration_s: float
    with_tokens: set[int] = field(default_factory=set)

    @property
    def min_end_ns(self) -> int:
        return self.run_start_ns + int(self.warmup.min_s * 1e9)

    @property
    def max_end_ns(self) -> int:
        return self.run_start_ns + int(max(self.warmup.max_s, self.warmup.min_s) * 1e9)

    def fixed(self) -> bool:
        """The window is known up front (no adaptive wait)."""
        return not self.warmup.adaptive or self.streams == 0

    def measure_start(self, now_ns: int) -> int | None:
        """The measurement start if it can be decided at `now_ns`, else None."""
        if self.fixed():
            return self.min_end_ns
        if now_ns < self.min_end_ns:
            return None
        if len(self.with_tokens) >= self.streams or now_ns >= self.max_end_ns:
            return now_ns
        return None

    def window(self, measure_start_ns: int) -> tuple[int, int]:
        return measure_start_ns, measure_start_ns + int(self.duration_s * 1e9)
