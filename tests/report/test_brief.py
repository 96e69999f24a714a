"""`itlbench run --brief`: one line per run, from the run's own summary.json (what sweep and capacity print per point)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.report.brief import brief_line
from itlbench.report.durations import fmt_s

runner = CliRunner()


def test_brief_run_prints_one_line_of_its_summary_instead_of_the_tables(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--streams", "4",
                                 "--inject", "8k@2s", "--duration", "5", "--brief", "--no-report", "--out", str(out)],
                           terminal_width=1000)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    flat = " ".join(result.output.split())  # the console wraps at its own width
    line = " ".join(brief_line(summary, out).split())
    assert line in flat and flat.count(f"{out}: ") == 1
    itl, ttft = summary["itl_s"], summary["ttft_s"]["all"]
    assert f"ITL p50 {fmt_s(itl['p50'])} p99 {fmt_s(itl['p99'])} max {fmt_s(itl['max'])}" in line
    assert f"TTFT p50 {fmt_s(ttft['p50'])}" in line
    assert f"(injected, longest {fmt_s(summary['ttft_by_class_s']['injected']['max'])})" in line
    assert f"{summary['requests']['ok']} of {summary['requests']['total']} ok" in line
    assert "TTFT by prompt bucket" not in result.output and "Inter-token latency" not in result.output


def test_an_invalid_run_says_why_in_its_line():
    summary = {"requests": {"ok": 3, "total": 4}, "valid": False, "stalls": {"events": 1, "worst_s": 1.5},
               "validity": {"reasons": ["the client's loop was paused 2.0 s"]}, "goodput": {"fraction": 0.75}}
    line = brief_line(summary, "R")
    assert line.endswith("goodput 75% · NOT valid: the client's loop was paused 2.0 s")
    assert "3 of 4 ok" in line and "1 stall event (worst 1.50 s)" in line


def test_a_run_that_measured_nothing_is_not_called_valid():
    line = brief_line({"requests": {"ok": 0, "total": 0}, "valid": True}, "R")
    assert line.endswith("· measured nothing") and "valid" not in line


def test_agent_sessions_at_a_rate_are_offered_in_sessions_per_second():
    offered = {"offered_rps": 1.9, "nominal_rps": 2.0}
    line = brief_line({"requests": {"ok": 1, "total": 1}, "offered": {**offered, "unit": "sessions/s"}}, "R")
    assert "offered 1.9 of the nominal 2.0 sessions/s" in line
    assert "offered 1.9 of the nominal 2.0 req/s" in brief_line({"requests": {"ok": 1, "total": 1},
                                                                 "offered": offered}, "R")


def test_every_reason_an_invalid_run_has_is_in_its_line(tmp_path):
    """A starved client and tokens that arrived together: the line showed only the first reason (the client's
    CPU), so a capacity search's point line hid that ITL was never measured. The first is said in full, the
    others in a few words each (the report's banner has every sentence)."""
    from itlbench.analysis.summary import analyze_run
    from tests.support.burst_runs import build_burst_run

    summary = analyze_run(build_burst_run(tmp_path / "run", burst_ms=100, client_cpu=90.0))
    first, second = summary["validity"]["reasons"]
    assert first.startswith("client CPU mean 90.0 %") and second.startswith("tokens arrived together")
    line = brief_line(summary, "R")
    assert line.endswith(f"· NOT valid: {first} (and 1 more: tokens arrived together (buffered), so no gap is "
                         "measurable)")
    three = {**summary, "validity": {**summary["validity"], "reasons": [*summary["validity"]["reasons"],
                                                                        "the server's log went quiet: no steps"]}}
    assert brief_line(three, "R").endswith("(and 2 more: tokens arrived together (buffered), so no gap is measurable; "
                                           "the server's log went quiet)")


def test_withdrawn_figures_are_marked_where_the_line_states_them():
    """A buffered server's gaps read 0 ms and its goodput 100 %: the line marks them, not only its tail."""
    summary = {"requests": {"ok": 4, "total": 4}, "valid": False, "itl_s": {"p50": 0.0, "p99": 0.002, "max": 0.05},
               "ttft_s": {"all": {"p50": 0.1, "p99": 0.2}}, "stalls": {"events": 0}, "goodput": {"fraction": 1.0},
               "throughput": {"output_tokens_per_s": 50.0},
               "validity": {"reasons": ["tokens arrived together: 80% of 1,937 gaps are 0"],
                            "affected": ["itl_s", "stalls", "goodput"]}}
    line = brief_line(summary, "R")
    assert "max 50 ms (not valid)" in line and "goodput 100% (not valid)" in line and "no stalls (not valid)" in line
    assert "p99 200 ms ·" in line and "50 output tok/s ·" in line  # TTFT and throughput stand
    only_max = {**summary, "validity": {"reasons": ["3 stall gaps are the client's own pauses"],
                                        "affected": ["stalls", "itl_s.max"]}}
    assert "max 50 ms (max not valid)" in brief_line(only_max, "R")
