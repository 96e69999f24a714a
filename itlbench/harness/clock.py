"""Which clock a run's simulated engine runs on (`itlbench run --clock`).

virtual: the engine in-process on a discrete-event clock (sim.virtual_run): each step moves time by
its predicted duration and nothing sleeps, so minutes of simulated load take seconds. real: the
bundled server paces the simulator in real time and the load driver measures it over HTTP like any
engine (client, network and server included). auto, the default, is virtual for the simulator
unless the run asks for something only the served path has, and real for every other engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from itlbench.errors import ConfigError

if TYPE_CHECKING:
    from itlbench.harness.run_config import RunConfig

CLOCKS = ("auto", "virtual", "real")


def served_only(cfg: RunConfig) -> list[str]:
    """The flags of `cfg` that need the served, real-time path (a client, a server, wall time)."""
    needs = [("--disaggregate", cfg.engine.disaggregate), ("--sim-time-scale", cfg.engine.sim_time_scale != 1),
             ("--workers", cfg.workers > 1), ("--driver locust", cfg.driver == "locust"),
             ("--metrics-port", cfg.metrics_port is not None), ("--otlp-endpoint", cfg.otlp_endpoint is not None),
             ("--api chat", cfg.api == "chat")]
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
