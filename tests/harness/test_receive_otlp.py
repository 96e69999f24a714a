"""`itlbench run --receive-otlp` without --endpoint: refused up front in one line naming the right flags, where it
used to run, wait 10 s for spans nothing would send, and advise a flag (vLLM's) the bundled server does not have."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.run_config import RunConfig

SIM = EngineConfig(model="llama-3.1-8b", engine="sim")


def test_the_in_process_simulator_refuses_receive_otlp_with_its_reason(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--streams", "3", "--inject",
                                   "1k@3s", "--duration", "5s", "--receive-otlp", "auto", "--out",
                                   str(tmp_path / "run3"), "--no-live", "--no-report"], terminal_width=400)
    assert res.exit_code == 2, res.output  # before: a run, 10 s waited, "warning: no spans reached ..."
    assert "--receive-otlp: the simulator runs in this process on a virtual clock" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "run3").exists()
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(("engine", "clock"), [(SIM, "real"), (EngineConfig(model="tiny"), "auto")])
def test_a_bundled_server_refuses_receive_otlp_and_names_its_own_flag(engine: EngineConfig, clock: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig(engine=engine, clock=clock, receive_otlp=True, streams=1).validate()
    assert info.value.field == "--receive-otlp" and "--endpoint" in info.value.problem
    assert "--otlp-endpoint URL" in info.value.fix  # the bundled server's flag, not vLLM's --otlp-traces-endpoint


def test_receive_otlp_with_an_endpoint_is_valid() -> None:
    RunConfig(endpoint="http://127.0.0.1:9/v1", model="m", receive_otlp=True, streams=1).validate()
    RunConfig(engine=SIM, streams=1).validate()  # and without it, the simulator runs as before
