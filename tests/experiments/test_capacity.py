"""`itlbench capacity`: the search's logic on a known threshold, then on a real server whose capacity is built in."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.errors import ConfigError
from itlbench.experiments.capacity import (
    CapacityPlan,
    SearchInterrupted,
    SearchPoint,
    measure_point,
    search,
    too_short,
)
from itlbench.experiments.capacity_answer import answer_line
from itlbench.experiments.capacity_judge import RunJudgement, parse_stall_budget
from itlbench.experiments.capacity_judge import judge_run as _judge_run
from itlbench.experiments.capacity_report import rerun_lines
from itlbench.testing.paced_server import PacedConfig, spawn

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _threshold(capacity: float, flaky_at: set[float] | None = None):
    """A measure function: loads up to `capacity` meet; at `flaky_at` the second run misses."""
    calls: list[tuple[float, str, int]] = []

    def measure(load: float, phase: str, repeats: int) -> SearchPoint:
        calls.append((load, phase, repeats))
        pt = SearchPoint(load, phase)
        for i in range(repeats):
            miss = load > capacity or (flaky_at is not None and load in flaky_at and i == 1)
            pt.runs.append(RunJudgement(Path("."), {}, ["missed"] if miss else []))
        return pt

    return measure, calls


def _mark_invalid(run_dir: Path, affected: list[str], reason: str) -> None:
    """What the run's validity checks write when the client itself was disturbed."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["valid"] = False
    summary["validity"] = {**(summary.get("validity") or {}), "affected": affected, "reasons": [reason]}
    path.write_text(json.dumps(summary))


def _judged(miss: bool, disturbed: bool = False) -> RunJudgement:
    return RunJudgement(Path("."), {}, ["ITL p99 60 ms > 52 ms"] if miss else [],
                        ["the client read late"] if disturbed else [])


def test_a_miss_while_the_client_was_disturbed_is_run_again_and_left_out() -> None:
    runs = iter([_judged(True, disturbed=True), _judged(False), _judged(False)])
    pt = measure_point(3, "bisect", 2, lambda: next(runs))
    assert pt.met and len(pt.runs) == 3 and [r.rerun for r in pt.runs] == [True, False, False]
    assert pt.as_dict(Path("."))["runs"][0]["disturbed"] == ["the client read late"]
    runs = iter([_judged(True, disturbed=True) for _ in range(3)])  # disturbed every time: after two reruns the miss counts
    pt = measure_point(3, "bisect", 1, lambda: next(runs))
    assert not pt.met and [r.rerun for r in pt.runs] == [True, True, False]
    runs = iter([_judged(True), _judged(False)])  # an undisturbed miss is the server's: no rerun
    pt = measure_point(3, "bisect", 2, lambda: next(runs))
    assert not pt.met and len(pt.runs) == 2
    result = search(CapacityPlan(axis="streams", start=4, repeat=1),
                    lambda load, phase, n: measure_point(load, phase, n, lambda: _judged(load > 5, load == 4)))
    assert (result.max_load, result.missed_at) == (5, 6) and result.confirmed
    assert any("run again" in line for line in rerun_lines(result))


def test_bracketing_then_bisection_finds_a_rate_within_the_resolution() -> None:
    measure, calls = _threshold(13.0)
    result = search(CapacityPlan(start=1, resolution=0.1, repeat=2), measure)
    assert [c[0] for c in calls[:5]] == [1, 2, 4, 8, 16], "doubling until the first miss"
    assert result.missed_at is not None and result.max_load is not None
    assert result.max_load <= 13.0 < result.missed_at
    assert result.missed_at - result.max_load <= 0.1 * result.max_load
    assert all(r == 2 for _, phase, r in calls if phase == "bisect"), "points near the boundary repeat"
    assert sum(len(p.runs) for p in result.points if p.load == result.max_load) >= 2, "the answer was re-run"


def test_streams_bisect_to_one_stream_and_a_flaky_answer_is_not_reported() -> None:
    measure, _ = _threshold(6.0)
    result = search(CapacityPlan(axis="streams", start=1, repeat=2), measure)
    assert (result.max_load, result.missed_at) == (6, 7)
    measure, _ = _threshold(6.0, flaky_at={6.0})  # 6 meets once, then misses on its repeat
    result = search(CapacityPlan(axis="streams", start=1, repeat=2), measure)
    assert (result.max_load, result.missed_at) == (5, 6) and result.confirmed
    measure, _ = _threshold(6.0)
    result = search(CapacityPlan(axis="streams", start=1, repeat=2, max_points=4), measure)
    assert not result.confirmed, "cut short by --max-points: the answer is marked unconfirmed"
    assert not result.inversions
    measure, _ = _threshold(6.0, flaky_at={2.0})  # 2 misses on its repeat, above 1 and below 4 which meet
    noisy = search(CapacityPlan(axis="streams", start=1, repeat=2), measure)
    noisy.points.append(measure(2.0, "bisect", 2))
    assert (4.0, 2.0) in noisy.inversions and "Not monotone" in answer_line(noisy)


def test_a_start_that_misses_searches_down_and_rate_max_caps_the_search() -> None:
    measure, calls = _threshold(0.3)
    result = search(CapacityPlan(start=4, resolution=0.2, repeat=1), measure)
    assert [c[0] for c in calls[:5]] == [4, 2, 1, 0.5, 0.25]
    assert result.max_load is not None and result.max_load <= 0.3 < result.missed_at  # type: ignore[operator]
    measure, calls = _threshold(100.0)
    result = search(CapacityPlan(start=1, load_max=5, repeat=1), measure)
    assert [c[0] for c in calls] == [1, 2, 4, 5] and (result.max_load, result.missed_at) == (5, None)
    assert result.confirmed


def _nothing_below(load_with_requests: float):
    """A measure function whose every point misses, and whose window holds no request below a load."""
    calls: list[float] = []

    def measure(load: float, phase: str, repeats: int) -> SearchPoint:
        calls.append(load)
        empty = load < load_with_requests
        figures = {"requests": 0.0 if empty else 4.0, "failed_requests": 0.0, "window_s": 5.0}
        return measure_point(load, phase, repeats, lambda: RunJudgement(
            Path("."), figures, ["no request finished"] if empty else ["ITL p99 8.2 ms > 1.0 ms"]))

    return measure, calls


def test_a_point_that_measured_nothing_stops_the_search_and_says_the_window_is_too_short() -> None:
    """`--slo itl_p99=1ms --duration 5`: 1 request/s misses, 0.5 has no request in its 5 s window; halving on
    to 1/64 of the start measured nothing six more times."""
    measure, calls = _nothing_below(1.0)
    result = search(CapacityPlan(start=1, repeat=2), measure)
    assert calls == [1, 0.5] and result.max_load is None and result.missed_at == 1
    assert result.stopped and "held no request" in result.stopped
    line = answer_line(result)
    assert line.startswith("No capacity found: even 1 requests/s misses every SLO, and at 0.5 requests/s the 5 s "
                           "measured window held no request, too short for that load")
    assert "--duration 20s" in line
    assert result.exit_code == 1, "no capacity found is not a success"
    assert result.as_dict(Path("."))["points"][1]["measured_nothing"] is True


def test_exit_status_tells_an_answer_from_none() -> None:
    measure, _ = _threshold(3.0)
    assert search(CapacityPlan(start=1, repeat=1), measure).exit_code == 0
    measure, _ = _threshold(0.0)  # every load misses, down to start/64
    result = search(CapacityPlan(start=1, repeat=1), measure)
    assert result.max_load is None and result.exit_code == 1 and answer_line(result).startswith("No load tried")


def test_an_interrupted_search_says_so_and_what_it_had_established() -> None:
    """Ctrl-C during the third point, its first run judged: the point is kept, the answer is not claimed."""
    inner, _ = _threshold(100.0)

    def measure(load: float, phase: str, repeats: int) -> SearchPoint:
        if load == 4:
            runs = iter([RunJudgement(Path("."), {}, [])])

            def run_once() -> RunJudgement:
                if (judged := next(runs, None)) is not None:
                    return judged
                raise SearchInterrupted(run=RunJudgement(Path("."), {}, ["ITL p99 60 ms > 52 ms"]))

            return measure_point(load, phase, 5, run_once)
        return inner(load, phase, repeats)

    result = search(CapacityPlan(start=1, repeat=2), measure)
    assert result.interrupted and result.interrupted_at == 4 and result.exit_code == 130
    assert [p.load for p in result.points] == [1, 2, 4] and result.points[-1].interrupted
    assert [r.interrupted for r in result.points[-1].runs] == [False, True], "the cut run is kept, not counted"
    assert answer_line(result) == ("Search interrupted (Ctrl-C or SIGTERM) at 4 requests/s: so far every SLO held "
                                   "up to 2 requests/s (capacity ≥ 2, not confirmed).")
    assert "Capacity ≥" not in answer_line(result)

    def at_once(load: float, phase: str, repeats: int) -> SearchPoint:
        raise SearchInterrupted()

    first = search(CapacityPlan(start=1), at_once)
    assert first.interrupted and first.points == [] and answer_line(first) == (
        "Search interrupted (Ctrl-C or SIGTERM) at 1 requests/s: no point had finished, so nothing was established.")


@pytest.mark.parametrize(("spec", "says"), [("worst=1x", "--stall-budget"), ("stalled=150%", "share"),
                                            ("freeze=1s", "worst=DUR")])
def test_bad_stall_budgets_name_the_flag(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_stall_budget(spec)
    assert err.value.field == "--stall-budget" and says in str(err.value)
    b = parse_stall_budget("worst=1s,stalled=1%,victims=0.1")
    assert (b.worst_s, b.stalled, b.victims) == (1.0, 0.01, 0.1)


def test_bad_capacity_options_exit_2_with_one_line(tmp_path: Path) -> None:
    for args, flag in ((["--axis", "tokens"], "--axis"), (["--rate", "3"], "--rate"),
                       (["--slo", "itl_p99=fast"], "--slo"), (["--serve", "srv"], "--serve"),
                       (["--max-points", "0"], "--max-points"), (["--max-points=-3"], "--max-points")):
        result = runner.invoke(app, ["capacity", "--out", str(tmp_path / "c"), *args], terminal_width=300)
        assert result.exit_code == 2, result.output
        assert f"error: {flag}" in " ".join(result.output.split()) and "Traceback" not in result.output
        assert not (tmp_path / "c").exists(), "bad input writes nothing"


# --- against a real server: the paced server slows down beyond a known load ---------------------------------

RUN = ["--no-report", "--workload", "fixed:16:20", "--duration", "5", "--warmup", "0.5", "--model", "paced"]


def test_the_capacity_of_a_server_built_to_hold_three_streams_is_three(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """ITL = 80 ms × max(1, streams / 2): 120 ms at 3 streams, 160 ms at 4; the SLO (150 ms) sits between.

    Load moves a p99 one way: a late tick is a long gap (the tick after it, catching up, a short one, which a
    p99 never sees), so a loaded box can push 3 streams over the SLO but cannot pull 4 under it, most of whose
    gaps stay 160 ms. The slack goes where load bites: 30 ms above 120 (CI's two shared cores once delayed a
    45 ms tick past a 52 ms SLO), 10 ms below 160. The search starts at 2
    streams: from there it still brackets (2 meets, 4 misses) and bisects to 3, one 7 s run (of 1 stream) fewer.
    """
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "cap"
    serve = (f"{shlex.quote(sys.executable)} -m itlbench.testing.paced_server --port {{port}} --tick-s 0.08 "
             "--degrade-above 2")
    result = runner.invoke(app, ["capacity", "--serve", serve, "--axis", "streams", "--start", "2", "--slo",
                                 "itl_p99=150ms", "--stall-budget", "worst=1s", "--out", str(out), *RUN],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["max_streams"] == 3 and doc["missed_at"] == 4, doc
    assert "Capacity: 3 streams" in " ".join(result.output.split())
    at = {p["load"]: p for p in doc["points"]}
    assert at[3]["met"] and not at[4]["met"]
    assert [p["load"] for p in doc["points"]][:2] == [2, 4], "bracketed from the start"
    assert at[4]["runs"][0]["figures"]["itl_p99_s"] > 0.150
    assert (out / "report.html").is_file() and (out / "figures" / "capacity_curve.png").is_file()
    assert (out / "server.log").is_file()


def test_the_rate_found_holds_when_rerun_and_twice_it_misses(tmp_path: Path) -> None:
    """Throughput capped at 8 streams × one token per 20 ms: 20 requests/s of 20 tokens; beyond, the queue grows.

    The search starts at 16 requests/s, under the cap (starting at 4, it spent two 4.5 s points, 4 and 8,
    climbing to 16 before it bracketed: the search's climbing is the unit tests' above)."""
    proc, url = spawn(PacedConfig(tick_s=0.02, degrade_above=8))
    try:
        out = tmp_path / "cap"
        run = ["--no-report", "--workload", "fixed:16:20", "--duration", "3", "--warmup", "0.5", "--model", "paced"]
        result = runner.invoke(app, ["capacity", "--endpoint", url, "--slo", "itl_p99=40ms", "--start", "16",
                                     "--resolution", "0.25", "--repeat", "1", "--out", str(out), *run],
                               terminal_width=200)
        assert result.exit_code == 0, result.output
        doc = json.loads((out / "capacity.json").read_text())
        rate = doc["max_rate"]
        assert rate is not None and 8 <= rate <= 24, doc
        verdicts = []
        for r in (rate, 2 * rate):
            rerun = tmp_path / f"rerun{r:g}"
            res = runner.invoke(app, ["run", "--endpoint", url, "--rate", f"{r:g}", "--slo", "itl_p99=40ms",
                                      "--no-live", "--out", str(rerun), *run], terminal_width=200)
            assert res.exit_code == 0, res.output
            verdicts.append(_judge_run(rerun, "itl_p99=40ms", parse_stall_budget(None)).met)
        assert verdicts == [True, False]
        missed = tmp_path / f"rerun{2 * rate:g}"
        judged = _judge_run(missed, "itl_p99=40ms", parse_stall_budget(None))
        assert judged.disturbed == [] or not json.loads((missed / "summary.json").read_text())["valid"]
        _mark_invalid(missed, ["itl_s", "stalls"], "the client's loop was paused 0.05 s")
        judged = _judge_run(missed, "itl_p99=40ms", parse_stall_budget(None))
        assert not judged.met and judged.disturbed == ["the client's loop was paused 0.05 s"]
        _mark_invalid(missed, ["stalls"], "the client's loop was paused 0.05 s")  # ITL stands: a real miss
        assert _judge_run(missed, "itl_p99=40ms", parse_stall_budget(None)).disturbed == []
    finally:
        proc.kill()
        proc.wait(5)


def test_capacity_runs_the_bundled_engine_when_no_server_is_named(tmp_path: Path) -> None:
    """The simulated engine in-process on its virtual clock, a search capped by --rate-max: it holds
    at every load tried (short fixed requests keep each run's analysis small)."""
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
                                 "--axis", "streams", "--start", "2", "--rate-max", "4", "--slo", "itl_p99=1s",
                                 "--workload", "fixed:128:32", "--duration", "2", "--warmup", "0.5", "--no-report", "--out", str(out)],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert [p["load"] for p in doc["points"]] == [2, 4, 4], "the top load is re-run before it is the answer"
    assert doc["max_streams"] == 4 and doc["missed_at"] is None and doc["confirmed"]
    assert "Capacity ≥ 4 streams" in " ".join(result.output.split()) and "Not confirmed" not in result.output
    # a simulated answer carries the simulator's error bar on that GPU
    assert "Sim check H100 SXM in 16-bit: MAPE " in " ".join(result.output.split())
    run = json.loads((out / "streams4" / "run2" / "run.json").read_text())
    assert run["config"]["endpoint"] is None and run["config"]["engine"]["engine"] == "sim"


def test_a_simulated_capacity_report_says_how_far_to_trust_the_simulator(tmp_path: Path) -> None:
    """The report a planner forwards carries the error bar the terminal printed: a 70B on one H100 leaves 5 % of
    the GPU for K/V, most of which a runtime keeps back and the simulated engine does not, so the report warns.
    (--no-report skips each run's own report, not the search's: rendering the runs' figures took most of the time.)"""
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--engine", "sim", "--model", "llama-3.3-70b", "--gpu", "h100", "--dtype",
                                 "fp8", "--max-model-len", "4096", "--axis", "streams", "--start", "2", "--rate-max",
                                 "2", "--slo", "itl_p99=1s", "--workload", "fixed:128:16", "--duration", "2",
                                 "--warmup", "0.5", "--no-report", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "> ⚠️ How far to trust the simulator: H100 SXM in fp8: MAPE " in report
    assert "K/V room only 5% of each GPU's memory (4.0 GiB): a runtime keeps about 2.9 GiB of that back" in report


def _offering(share: float, capacity: float = 5.0, unit: str = "req/s"):
    """A measure function whose runs offered `share` of each nominal rate (10 s windows, Poisson counts); `unit`
    is what their summaries' `offered.unit` says --rate counted."""
    def measure(load: float, phase: str, repeats: int) -> SearchPoint:
        pt = SearchPoint(load, phase)
        for _ in range(repeats):
            figures = {"offered_rps": load * share, "arrivals": load * share * 10, "expected_arrivals": load * 10,
                       "window_s": 10.0, "count_noise": (load * 10) ** -0.5}
            pt.runs.append(RunJudgement(Path("."), figures, ["missed"] if load > capacity else [], rate_unit=unit))
        return pt

    return measure


def test_an_answer_offered_well_below_its_nominal_rate_says_what_was_offered_and_the_fix() -> None:
    result = search(CapacityPlan(start=4, resolution=0.5, repeat=1), _offering(0.65))
    line, doc = answer_line(result), result.as_dict(Path("."))
    assert (result.max_load, result.missed_at) == (4, 6)  # the search keys on the nominal rate, as it sets it
    assert ("Offered only 2.6 requests/s at 4 (35% below the nominal: its 10 s windows held 26 arrivals where the "
            "rate implies 40), so what the server was shown to sustain is 2.6 requests/s offered; the lowest miss, "
            "6 requests/s, offered 3.9.") in line
    assert "--duration 100s" in line
    assert doc["max_rate_offered"] == pytest.approx(2.6) and doc["offered_at_max"]["shortfall"] == pytest.approx(0.35)
    assert [p["offered_rps"] for p in doc["points"]] == pytest.approx([2.6, 5.2, 3.9])
    near = search(CapacityPlan(start=4, resolution=0.5, repeat=1), _offering(0.95))
    assert "Offered" not in answer_line(near) and near.as_dict(Path("."))["offered_note"] is None
    closed = search(CapacityPlan(axis="streams", start=4, repeat=1), _threshold(5)[0])
    assert "Offered" not in answer_line(closed) and closed.as_dict(Path("."))["max_rate_offered"] is None


def test_a_search_that_met_everywhere_names_the_limit_that_stopped_it() -> None:
    """`--max-points 3` stopped a search that met at 1, 2 and 4: it said 'raise --rate-max', which it never reached."""
    measure, _ = _threshold(100.0)
    by_points = search(CapacityPlan(start=1, repeat=1, max_points=3), measure)
    assert by_points.missed_at is None and "(raise --max-points (it ran all 3) to look further)" in answer_line(by_points)
    by_max = search(CapacityPlan(start=1, repeat=1, load_max=4), measure)
    assert by_max.max_load == 4 and "(raise --rate-max to look further)" in answer_line(by_max)


def test_the_answer_says_what_held_the_engines_queue_at_the_first_load_that_missed() -> None:
    """A TTFT miss at capacity has a cause a user can move (the batch cap, the chunk budget, K/V memory)."""
    held = "Requests waited for the engine in 17% of the window (queue p99 3.03 s): the running batch was full"

    def measure(load: float, phase: str, repeats: int) -> SearchPoint:
        pt = SearchPoint(load, phase)
        for _ in range(repeats):
            miss = load > 4.5
            pt.runs.append(RunJudgement(Path("."), {}, ["missed"] if miss else [], queueing=held if miss else None))
        return pt

    result = search(CapacityPlan(start=1, resolution=0.1, repeat=1), measure)
    assert result.missed_at is not None
    line = answer_line(result)
    assert line.endswith(f" At {result.plan.fmt(result.missed_at)} requests/s: Requests waited for the engine in 17% "
                         "of the window (queue p99 3.03 s): the running batch was full"), line


def test_a_search_whose_rate_counted_agent_sessions_answers_in_sessions_per_second() -> None:
    """`--workload agent --rate R` is R sessions a second (summary.json's offered.unit): the answer, its offered
    caveat, capacity.json and a too-short window say sessions/s, never requests/s."""
    result = search(CapacityPlan(start=4, resolution=0.5, repeat=1), _offering(0.65, unit="sessions/s"))
    line = answer_line(result)
    assert line.startswith("Capacity: 4 sessions/s (every SLO holds; 6 sessions/s misses, so the boundary lies "
                           "within +2 sessions/s).")
    assert "Offered only 2.6 sessions/s at 4" in line and "the lowest miss, 6 sessions/s, offered 3.9" in line
    assert "requests/s" not in line and result.as_dict(Path("."))["unit"] == "sessions/s"
    empty = SearchPoint(0.5, "bracket", [RunJudgement(Path("."), {"requests": 0.0}, [], rate_unit="sessions/s")])
    assert too_short(result.plan, empty).startswith("at 0.5 sessions/s the measured window held no request")
    assert "for about 10 sessions" in too_short(result.plan, empty)
    assert search(CapacityPlan(start=4, resolution=0.5, repeat=1), _offering(0.65)).unit == "requests/s"
    assert search(CapacityPlan(axis="streams", start=4, repeat=1), _threshold(5)[0]).unit == "streams"


def test_a_trace_replay_searches_its_speed_since_it_has_no_rate_to_set(tmp_path: Path) -> None:
    """`capacity --trace` refused with "--rate: a trace replays its own arrival times": the search set --rate,
    which a trace cannot take. It searches --time-scale instead (the trace replayed faster), by default."""
    trace = tmp_path / "trace.csv"
    rows = [f"2023-11-16 18:17:{i // 4:02d}.{(i % 4) * 25:02d}0000,{256 + 64 * (i % 3)},8" for i in range(160)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
                                 "--start", "1", "--rate-max", "2", "--repeat", "1", "--slo", "ttft=10s,itl_p99=1s",
                                 "--workload", "trace", "--trace", str(trace), "--duration", "4", "--warmup", "0",
                                 "--no-report", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["axis"] == "time-scale" and doc["max_time_scale"] == 2 and [p["load"] for p in doc["points"]][:2] == [1, 2]
    assert "Capacity ≥ 2 × the trace's speed" in " ".join(result.output.split())
    run = json.loads((out / "time-scale2" / "run1" / "run.json").read_text())
    assert run["plan"]["trace"]["time_scale"] == 2
    refused = runner.invoke(app, ["capacity", "--axis", "tides"])
    assert refused.exit_code == 2 and "use rate, streams or time-scale" in " ".join(refused.output.split())
