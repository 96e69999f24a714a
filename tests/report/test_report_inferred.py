"""A run against a server with no step log gets the engine-steps figure and the split from inferred steps,
marked as inferred, with no extra command (the report at the end of the run infers them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.report import inferred
from itlbench.report.data import load_run
from itlbench.report.figures import split_figure
from itlbench.report.steps_figure import engine_steps_figure
from itlbench.testing.paced_server import PacedConfig, spawn

pytestmark = pytest.mark.e2e
runner = CliRunner()
TICK_S = 0.02  # the paced server's one global step: every stream gets its token on it


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inferred") / "run"
    proc, url = spawn(PacedConfig(tick_s=TICK_S))
    try:
        res = runner.invoke(app, ["run", "--endpoint", url, "--model", "paced", "--workload", "fixed:16:20",
                                  "--streams", "6", "--duration", "3", "--warmup", "0.5", "--no-live",
                                  "--out", str(out)], terminal_width=200)
    finally:
        proc.kill()
        proc.wait(5)
    assert res.exit_code == 0, res.output
    return out


def test_the_run_report_draws_the_engine_steps_inferred_and_says_so(run_dir: Path) -> None:
    md = " ".join((run_dir / "report.md").read_text().split())
    assert "**The engine's steps (inferred from the client's stamps).**" in md
    assert "Inferred, not logged:" in md and "publishes no step log" in md
    assert "'Prefill : decode split (estimated from inferred steps)'" in md
    assert (run_dir / "figures" / "engine_steps.png").is_file()


def test_the_inferred_steps_keep_the_servers_pace(run_dir: Path) -> None:
    data = load_run(run_dir)
    assert data.steps.is_empty()  # nothing logged: what the figure shows is inferred
    spec = engine_steps_figure(data)
    assert spec.inferred and spec.figure is not None and "Inferred, not logged" in spec.caption
    view = data.inferred_cache["view"]
    spacing = ((view.steps["end_ns"] - view.steps["start_ns"]) / 1e9).median()
    assert spacing == pytest.approx(TICK_S, rel=0.15)  # one inferred step per server tick
    assert not view.cut and view.steps.height > 50
    split = split_figure(data)
    assert split.inferred and view.split["source"] == "client_inferred"


def test_a_run_too_large_for_the_report_draws_its_head_and_leaves_the_split_to_analyze(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inferred, "MAX_ROWS", 200)
    data = load_run(run_dir)
    view = inferred.inferred_view(data, 0.0, data.window.seconds)
    assert view is not None and view.cut and view.split is None
    assert "--attribution client" in (view.split_note or "")
    assert 0 < (view.hi_ns - view.lo_ns) / 1e9 < data.window.seconds
    spec = split_figure(data)
    assert spec.figure is None and "--attribution client" in (spec.note or "")
