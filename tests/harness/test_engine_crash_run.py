"""A run whose bundled server loses its in-process engine (the served simulator) mid-run keeps every record it
collected, the streams in flight with their tokens and the error naming the exception, and says the server died
(before, the server kept serving nothing: the run was aborted after failures in a row and read as a live server's)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.serving.fault_hook import FAULT_ENV


def test_a_run_whose_engine_dies_keeps_its_records_and_says_the_server_died(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(FAULT_ENV, "100")  # the server inherits it: its engine's 100th step raises
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--clock", "real", "--model", "llama-3.1-8b",
                                   "--sim-time-scale", "4", "--streams", "4", "--duration", "6s", "--no-live",
                                   "--no-report", "--out", str(out)], terminal_width=400)
    assert res.exit_code == 1, res.output  # ended early, its records written
    doc = json.loads((out / "run.json").read_text())
    assert doc["server_exit_code"] == 2 and "the engine server died during the run (exit code 2)" in res.output
    assert "error: the engine stopped: RuntimeError: injected engine fault at step 100" in (out / "server.log").read_text()
    failed = pl.read_parquet(out / "requests").filter(pl.col("error").str.contains("RuntimeError: injected engine fault"))
    cut = failed.filter(pl.col("http_status") == 200)  # mid-stream; a request sent after it died got a 503 naming it
    assert cut.height == 4 and cut["output_tokens"].min() > 0, cut  # the four streams in flight, their tokens kept
    assert set(failed.filter(pl.col("http_status") != 200)["http_status"]) <= {503}
