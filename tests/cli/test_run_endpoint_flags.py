"""With --endpoint the bundled engine never starts: its flags are refused, not silently ignored, and no fix
names one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.testing.openai_peer import OpenAIPeer, PeerConfig, serve_in_thread

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


class _CountingPeer(OpenAIPeer):
    """The test peer, noting every request it is sent (the /v1/models probe included)."""

    def app(self) -> web.Application:
        app = super().app()
        self.seen: list[str] = []

        @web.middleware
        async def note(request: web.Request, handler: Any) -> web.StreamResponse:
            self.seen.append(f"{request.method} {request.path}")
            return await handler(request)

        app.middlewares.append(note)
        return app


@pytest.mark.parametrize(("args", "line"), [
    (["--workload", "trace"], "error: --trace: workload 'trace' needs a CSV"),
    (["--workload", "trace", "--trace", "{tmp}/missing.csv"], "error: --trace: no trace file at"),
    (["--trace", "{tmp}/missing.csv"], "error: --trace: a trace file only applies to --workload trace"),
    (["--workload", "trace", "--trace", "{tmp}/missing.csv", "--rate", "2"], "error: --rate: a trace replays"),
    (["--inject-max-tokens", "0"], "error: --inject-max-tokens: must be >= 1, got 0 (give at least one token, e.g. --inject-max-tokens 16)"),
    (["--metrics-port", "0", "--workload", "trace"], "error: --trace: workload 'trace' needs a CSV"),
    (["--receive-otlp", "auto", "--inject-max-tokens", "0"], "error: --inject-max-tokens: must be >= 1"),
    (["--receive-otlp", "auto", "--out", "{tmp}/a-file"], "error: --out: {tmp}/a-file is a file, not a directory"),
])
def test_bad_input_with_an_endpoint_is_one_line_before_anything_is_sent_or_said(tmp_path: Path, args: list[str],
                                                                                  line: str) -> None:
    """A live server is there (its probe would succeed): bad input that needs none of it is refused first, as the one
    line of output: no "probing …", no "client metrics …" or "receiving OTLP spans …", no request sent."""
    (tmp_path / "a-file").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = ["--out", str(tmp_path / "run")] if "--out" not in args else []
    with serve_in_thread(PeerConfig(), peer_cls=_CountingPeer) as (peer, url):
        result = runner.invoke(app, ["run", "--endpoint", url, "--duration", "4s", "--no-live", "--no-report",
                                     *args, *out], terminal_width=400)
    lines = [s for s in result.output.splitlines() if s.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(line.replace("{tmp}", str(tmp_path))), result.output
    assert peer.seen == [] and not (tmp_path / "run").exists()


def test_a_dead_endpoint_says_what_it_probed_and_why_it_failed_and_nothing_of_the_metrics(tmp_path: Path) -> None:
    """Input that is fine reaches the probe: a closed port gives "probing URL" and the error, and the live metrics'
    URL (said once the run goes on) is not printed for a run that never started."""
    result = runner.invoke(app, ["run", "--endpoint", "http://127.0.0.1:9/v1", "--metrics-port", "0", "--duration",
                                 "4s", "--no-live", "--no-report", "--out", str(tmp_path / "run")], terminal_width=400)
    lines = [s for s in result.output.splitlines() if s.strip()]
    assert result.exit_code == 2, result.output
    assert lines[0] == "probing http://127.0.0.1:9/v1" and lines[1].startswith("error: --endpoint: GET"), lines
    assert len(lines) == 2 and "client metrics" not in result.output and not (tmp_path / "run").exists()
