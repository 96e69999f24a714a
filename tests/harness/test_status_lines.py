"""The line a run prints while its server starts says which engine that is."""

from __future__ import annotations

from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import _starting
from itlbench.harness.run_config import RunConfig


def test_the_starting_line_names_the_engine_or_the_endpoint() -> None:
    """Before: a served simulator (--engine sim --clock real) was announced as 'the bundled engine'."""
    sim = RunConfig(engine=EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h200"))
    assert _starting(sim) == "starting the simulated engine (llama-3.1-8b on h200)"
    assert _starting(RunConfig(engine=EngineConfig(model="llama-3.1-8b", engine="sim"))).endswith("on h100)")
    assert _starting(RunConfig(engine=EngineConfig(model="cpu-small"))) == "starting the bundled engine (cpu-small)"
    assert _starting(RunConfig(endpoint="http://127.0.0.1:8000/v1")) == "probing http://127.0.0.1:8000/v1"
