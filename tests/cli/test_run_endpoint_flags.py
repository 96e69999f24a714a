"""With --endpoint the bundled engine never starts: its flags are refused, not silently ignored, and no fix
names one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread

runner = CliRunner()


@pytest.mark.parametrize(("args", "flag"), [(["--chunk-budget", "512"], "--chunk-budget"),
                                            (["--max-model-len", "8192"], "--max-model-len"),
                                            (["--engine", "sim"], "--engine")])
def test_an_engine_flag_with_endpoint_is_refused_naming_it(tmp_path: Path, args: list[str], flag: str) -> None:
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--endpoint", "http://127.0.0.1:9/v1", *args, "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert f"{flag}: configures the bundled engine" in result.output and "set it on your server" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_inject_over_an_endpoints_context_names_no_engine_flag(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serve_in_thread(PeerConfig(max_model_len=4096)) as (_, url):
        result = runner.invoke(app, ["run", "--endpoint", url, "--inject", "8k", "--duration", "4s", "--no-live",
                                     "--no-report", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "--inject:" in result.output and "inject at most 4080 tokens" in result.output
    assert "--max-model-len" not in result.output and not out.exists()
