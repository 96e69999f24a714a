"""Reports from real runs on the bundled CPU engine: written by every run (a killed one's:
test_kill9_analyze.py), a chunk-budget sweep that orders as the physics says, and the phases measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.server import BackgroundServer

pytestmark = pytest.mark.e2e
runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


def _start_run(out: Path, duration: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "itlbench", "run", "--model", "tiny", "--workload", "chat-short",
           "--streams", "2", "--inject", "1024@1s", "--duration", str(duration), "--warmup", "0.5", "--no-live",
           "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_finished_run_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start_run(out, 3.0)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert stdout.strip().splitlines()[-1] == str(out)
    assert f"Report {out / 'report.html'}" in _flat(stderr)
    html = _flat((out / "report.html").read_text())
    assert "inj-000 (1k tokens) was prefilled in 1 engine step" in html and "cut short" not in html
    assert (out / "report.md").is_file()
    assert {p.stem for p in (out / "figures").glob("*.png")} >= {"stalls", "engine_steps", "ttft", "itl_cdf"}


def test_sweep_orders_worst_gap_and_injected_ttft_as_the_physics_says(tmp_path: Path) -> None:
    """A tiny budget splits the 4k prompt into hundreds of short steps: short gaps for the streams, but the
    prompt pays every step's fixed cost; unchunked, one long step freezes everyone and TTFT is shortest.
    The window leaves seconds after the prefill so the unchunked stall ends inside it on a slow box."""
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", "--chunk-budget", "16,none", "--out", str(out), "--model", "cpu-small",
                                 "--workload", "chat-short", "--streams", "4", "--inject", "4096@1s", "--duration", "6",
                                 "--warmup", "1", "--no-live", "--json"], terminal_width=200)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "compare.json").read_text())["rows"]
    shown = json.loads(result.stdout)  # --json: stdout is one document (each run's own line went to stderr)
    assert shown["rows"] == rows and shown["sweep_dir"] == str(out)
    assert [r["setting"] for r in rows] == ["budget 16", "unchunked"]
    small, whole = rows
    assert small["worst_gap_s"] < whole["worst_gap_s"], rows
    assert small["injected_ttft_s"] > whole["injected_ttft_s"], rows
    for sub in ("b16", "unchunked"):
        assert (out / sub / "report.html").is_file() and (out / sub / "summary.json").is_file()
    html = _flat((out / "report.html").read_text())
    assert html.count("<tr>") >= 3 and "Smoothest streams: budget 16" in html


def test_bad_sweep_options_exit_2_and_leave_nothing(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    for args, flag in ((["--chunk-budget", "0"], "--chunk-budget"), (["--policy", "fifo"], "--policy"),
                       (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint"), (["--workload", "nope"], "--workload")):
        result = runner.invoke(app, ["sweep", "--out", str(out), *args], terminal_width=300)
        assert result.exit_code == 2, result.output
        assert f"error: {flag}" in _flat(result.output) and "Traceback" not in result.output
        assert not out.exists()


def test_phases_measures_prefill_and_decode_apart(tmp_path: Path) -> None:
    out = tmp_path / "phases"
    result = runner.invoke(app, ["phases", "--model", "tiny", "--lengths", "1,16,128,512,8k", "--repeats", "1",
                                 "--concurrency", "4", "--output-tokens", "8", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "phases.json").read_text())
    assert [r["prompt_tokens"] for r in doc["rows"]] == [1, 16, 128, 512]
    # tiny's 4,096-token context cannot hold an 8k prompt: skipped, and said so
    assert "--lengths: 8,192 does not fit the context (4,096 tokens, 9 of them kept for the output): skipped" \
        in _flat(result.output)
    assert all(r["engine_prefill_s"] and r["client_ttft_s"] >= r["engine_prefill_s"] for r in doc["rows"]), \
        "the client's TTFT includes the engine's prefill"
    assert [d["batch"] for d in doc["decode"]] == [1, 4]
    assert all(d["engine_steps"] > 0 and d["tokens_per_s_total"] for d in doc["decode"])
    assert (out / "figures/phases.png").stat().st_size > 5_000
    assert "Prefill vs decode, measured apart" in (out / "report.html").read_text()


def test_phases_rejects_bad_options(tmp_path: Path) -> None:
    for args, flag in ((["--concurrency", "0"], "--concurrency"), (["--lengths", "2q"], "--lengths"),
                       (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint")):  # nothing listens there
        result = runner.invoke(app, ["phases", "--out", str(tmp_path / "p"), *args], terminal_width=300)
        assert result.exit_code == 2, result.output
        assert f"error: {flag}" in _flat(result.output)


def test_a_run_against_an_external_endpoint_is_labelled_with_its_engine(tmp_path: Path,
                                                                        server: BackgroundServer) -> None:
    """An itlbench server reached with --endpoint is an external engine: the report names it and says its
    figures come from its step log; `compare` labels the row the same way."""
    out = tmp_path / "ext"
    result = runner.invoke(app, ["run", "--endpoint", server.base_url, "--model", "tiny", "--workload", "chat-short",
                                 "--streams", "2", "--duration", "2", "--warmup", "0.5", "--no-live", "--out", str(out)],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    html = _flat((out / "report.html").read_text())
    assert "External engine: itlbench server (tiny) (identified by GET /v1/engine)" in html
    assert "engine step log (itlbench server on the same host)" in html
    compared = runner.invoke(app, ["compare", str(out), "--out", str(tmp_path / "cmp")], terminal_width=200)
    assert compared.exit_code == 0, compared.output
    row = json.loads((tmp_path / "cmp/compare.json").read_text())["rows"][0]
    assert row["engine"] == "itlbench server (tiny)" and row["setting"].startswith("itlbench server (tiny): budget")
