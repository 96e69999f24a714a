"""Load as a sweep axis: one point per stream count (or rate), and latency drawn against load."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.report.data import load_run
from itlbench.report.load_curve import curve_points

pytestmark = pytest.mark.e2e
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_a_streams_sweep_draws_latency_against_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paced server slows beyond 2 decoding streams: ITL 20 ms at 2 streams, 80 ms at 8."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "load"
    serve = (f"{shlex.quote(sys.executable)} -m itlbench.testing.paced_server --port {{port}} --tick-s 0.02 "
             "--degrade-above 2")
    result = runner.invoke(app, ["sweep", "--serve", serve, "--streams", "2,8", "--out", str(out), "--model", "paced",
                                 "--workload", "fixed:16:30", "--duration", "3", "--warmup", "0.5", "--no-live", "--no-report"],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "compare.json").read_text())
    assert [r["setting"] for r in doc["rows"]] == ["streams 2", "streams 8"]
    low, high = (r["itl_p50_s"] for r in doc["rows"])
    assert low == pytest.approx(0.02, rel=0.3) and high == pytest.approx(0.08, rel=0.3)
    assert "Latency against load" in (out / "report.md").read_text()
    assert (out / "figures" / "compare_load.png").stat().st_size > 10_000
    curves = curve_points([load_run(out / p) for p in ("s2", "s8")], "streams")
    (series,) = curves.values()
    assert [p["load"] for p in series] == [2.0, 8.0]
    assert series[1]["achieved_rps"] is not None and series[1]["itl_p99_s"] > series[0]["itl_p99_s"]


def test_a_rate_sweep_draws_what_each_point_offered_beside_its_nominal_rate(tmp_path: Path) -> None:
    """A short window offers fewer or more arrivals than the nominal rate: the curve carries the offered rate.
    (--no-report skips each run's own report, not the sweep's comparison and its load figure.)"""
    out = tmp_path / "rates"
    result = runner.invoke(app, ["sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "2,4",
                                 "--workload", "fixed:256:16", "--duration", "10", "--warmup", "1", "--no-live",
                                 "--no-report", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    runs = [load_run(p) for p in sorted(q for q in out.iterdir() if (q / "summary.json").is_file())]
    (series,) = curve_points(runs, "rate").values()
    assert [p["load"] for p in series] == [2.0, 4.0]
    for point, run in zip(series, runs, strict=True):
        offered = run.summary["offered"]
        assert point["offered_rps"] == pytest.approx(offered["arrivals"] / offered["window_s"])
    assert any(p["offered_rps"] != p["load"] for p in series), "a 10 s Poisson window rarely offers the nominal exactly"
    assert (out / "figures" / "compare_load.png").stat().st_size > 10_000
    # agent sessions arriving at --rate: the axis counts sessions, the achieved rate requests (several a session)
    from itlbench.report.load_curve import load_figure

    rate_ax = load_figure(runs).figure.axes[2]
    assert rate_ax.get_xlabel() == "nominal rate (requests/s)" and "nominal" in rate_ax.get_legend_handles_labels()[1]
    for run in runs:
        run.summary["offered"] = {**run.summary["offered"], "unit": "sessions/s"}
    rate_ax = load_figure(runs).figure.axes[2]
    assert rate_ax.get_xlabel() == "nominal rate (sessions/s)" and "several" in rate_ax.get_title(loc="left")
    assert "nominal" not in rate_ax.get_legend_handles_labels()[1], "sessions/s and requests/s share no diagonal"
