"""A search over a server whose tokens arrive together above some load: those loads are not judged on ITL, so the
answer is a floor the search measured, never a capacity nobody measured, and capacity.json, the report and the
answer sentence say where ITL could not be measured, why, and what would measure it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from itlbench.experiments.capacity import (
    CapacityPlan,
    SearchPoint,
    measure_point,
    search,
    write_capacity_json,
)
from itlbench.experiments.capacity_answer import UNMEASURED_FIX, answer_line
from itlbench.experiments.capacity_judge import RunJudgement, judge_run, parse_stall_budget
from itlbench.experiments.capacity_report import not_judged_lines, points_table, write_capacity_report
from tests.support.burst_runs import build_burst_run


def _server(root: Path, bursts_above: float, slo: str | None = None,
            slow_first_above: float | None = None) -> Callable[[float, str, int], SearchPoint]:
    """A measure function writing each run as the server would deliver it at that load, judged by the real code:
    above `bursts_above` its tokens arrive together in 100 ms bursts; above `slow_first_above` in 400 ms bursts,
    which hold the first token 500 ms (a TTFT miss against ttft=300ms)."""
    count: dict[float, int] = {}

    def run_once(load: float) -> RunJudgement:
        count[load] = count.get(load, 0) + 1
        slow = slow_first_above is not None and load > slow_first_above
        burst = 400 if slow else 100 if load > bursts_above else 0
        run_dir = build_burst_run(root / f"load{load:g}" / f"run{count[load]}", burst_ms=burst)
        return judge_run(run_dir, slo, parse_stall_budget(None))

    return lambda load, phase, n: measure_point(load, phase, n, lambda: run_once(load))


def test_loads_whose_itl_was_never_measured_do_not_raise_the_answer(tmp_path: Path) -> None:
    """Tokens streamed up to 2.5 requests/s and came in bursts above: 4 and 3 requests/s used to be 'met' (ITL p99
    100 ms < 200 ms) and the search answered 'Capacity ≥ ...' at whatever --rate-max allowed."""
    result = search(CapacityPlan(start=1, resolution=0.25, repeat=2), _server(tmp_path, bursts_above=2.5))
    assert [(p.load, p.met, p.not_judged) for p in result.points] == [
        (1, True, False), (2, True, False), (4, False, True), (3, False, True), (2.5, True, False)]
    assert (result.max_load, result.not_judged_at, result.missed_at) == (2.5, 3, None)
    assert result.confirmed and result.exit_code == 0 and not result.inversions
    assert all(not r.rerun for p in result.points for r in p.runs), "not judged is not run again"
    line = answer_line(result)
    assert line.startswith("Capacity ≥ 2.5 requests/s: every SLO holds there, but ITL could not be measured at "
                           "3 requests/s: tokens arrived together (80% of 1,937 gaps are 0), so above 2.5 "
                           "requests/s the capacity is not known. " + UNMEASURED_FIX), line
    assert "Capacity: " not in line and "misses" not in line

    write_capacity_json(result, tmp_path)
    doc = json.loads((tmp_path / "capacity.json").read_text())
    assert doc["max_rate"] == 2.5 and doc["not_judged_at"] == 3 and doc["missed_at"] is None
    assert doc["not_judged_why"][0].startswith("tokens arrived together (80% of 1,937 gaps are 0)")
    at3 = next(p for p in doc["points"] if p["load"] == 3)
    assert at3["met"] is False and at3["not_judged"] is True and at3["unmeasured"] == doc["not_judged_why"]
    assert [r["not_judged"] for r in at3["runs"]] == [["ITL p99"], ["ITL p99"]]
    assert all(r["misses"] == [] and r["figures"]["itl_p99_s"] is None for r in at3["runs"])

    table = points_table(result)
    row = table.rows[[p.load for p in result.points].index(3)]
    assert row[table.headers.index("met")] == "not judged" and row[table.headers.index("ITL p99")] == "—"
    assert row[table.headers.index("what missed")] == ("not judged (ITL p99): tokens arrived together (80% of "
                                                       "1,937 gaps are 0)")
    assert len(not_judged_lines(result)) == 3 and "ITL is not measurable" in not_judged_lines(result)[0]
    write_capacity_report(result, tmp_path, "itlbench capacity", "a bursting server")
    report = (tmp_path / "report.md").read_text()
    assert "> ⚠️ Capacity ≥ 2.5 requests/s: every SLO holds there, but ITL could not be measured" in report
    assert "rate 4, run1: not judged on ITL p99; its validity checks said: tokens arrived together" in report


def test_a_measured_miss_above_bounds_the_load_not_judged(tmp_path: Path) -> None:
    """Streamed up to 2 streams, bursting at 3, and at 4 the first token waits 500 ms against ttft=300ms: 4 misses
    on TTFT, which was measured, though its ITL was not either."""
    result = search(CapacityPlan(axis="streams", start=1, repeat=1),
                    _server(tmp_path, bursts_above=2, slo="ttft=300ms", slow_first_above=3))
    assert [(p.load, p.met, p.missed, p.not_judged) for p in result.points] == [
        (1, True, False, False), (2, True, False, False), (4, False, True, False), (3, False, False, True)]
    assert (result.max_load, result.not_judged_at, result.missed_at) == (2, 3, 4)
    line = answer_line(result)
    assert ("Capacity ≥ 2 streams: every SLO holds there, but ITL could not be measured at 3 streams: tokens arrived "
            "together (80% of 1,937 gaps are 0), so above 2 streams the capacity is not known (it is below 4 "
            "streams, which misses).") in line
    assert result.as_dict(tmp_path)["margin"] == 2


def test_when_no_load_could_be_judged_no_capacity_is_claimed(tmp_path: Path) -> None:
    result = search(CapacityPlan(start=1, repeat=1, max_points=3), _server(tmp_path, bursts_above=0))
    assert [p.load for p in result.points] == [1, 0.5, 0.25] and all(p.not_judged for p in result.points)
    assert result.max_load is None and result.missed_at is None and result.exit_code == 1
    assert answer_line(result) == ("No capacity found: ITL could not be measured at any load tried, 1 down to 0.25 "
                                   "requests/s: tokens arrived together (80% of 1,937 gaps are 0). " + UNMEASURED_FIX)
