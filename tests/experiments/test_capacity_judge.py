"""One run judged for the capacity search: a run whose tokens arrived together has no ITL to judge, so a check on
ITL (or on the stalls it times) is neither met nor missed, while what was measured (TTFT) still counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlbench.experiments.capacity import measure_point
from itlbench.experiments.capacity_judge import judge_run, parse_stall_budget
from itlbench.report.data import load_run
from tests.support.burst_runs import build_burst_run

NONE = parse_stall_budget(None)


def summary_warning(run_dir: Path) -> str:
    return load_run(run_dir).summary["arrived_together"]["warning"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Streamed (0), in 100 ms bursts (ITL p99 100 ms, under the default 200 ms), in 400 ms bursts (over it)."""
    root = tmp_path_factory.mktemp("burst")
    return {b: build_burst_run(root / f"b{b}", burst_ms=b) for b in (0, 100, 400)}


def test_a_run_whose_tokens_arrived_together_is_not_judged_on_itl(runs: dict[int, Path]) -> None:
    """vLLM-CPU's bursts read ITL p99 100 ms against 200 ms: the search called the load met, though the run's
    own validity checks had withdrawn ITL."""
    summary = load_run(runs[100]).summary
    assert summary["valid"] is False and "itl_s" in summary["validity"]["affected"]
    assert summary["itl_s"]["p99"] <= 0.2  # what the search used to read as met
    judged = judge_run(runs[100], None, NONE)
    assert not judged.met and judged.misses == [] and judged.disturbed == []
    assert judged.not_judged == ["ITL p99"]
    assert judged.unmeasured == [summary["arrived_together"]["warning"]]
    assert judged.unmeasured[0].startswith("tokens arrived together (80% of ")
    assert judged.figures["itl_p99_s"] is None and judged.figures["worst_gap_s"] is None, "withdrawn, not 100 ms"
    assert judged.figures["ttft_p90_s"] == pytest.approx(0.2), "TTFT was measured and stays"
    streamed = judge_run(runs[0], None, NONE)
    assert streamed.met and streamed.not_judged == [] and streamed.unmeasured == []


def test_the_stall_budget_rests_on_the_same_gaps_and_is_not_judged_either(runs: dict[int, Path]) -> None:
    judged = judge_run(runs[100], None, parse_stall_budget("worst=1s,stalled=1%,victims=10%"))
    assert judged.not_judged == ["ITL p99", "worst gap (stall budget)", "stalled share (stall budget)",
                                 "requests stalled (stall budget)"]
    assert judged.figures["stalled_share"] is None and judged.figures["victims_share"] is None
    assert judge_run(runs[0], None, parse_stall_budget("worst=1s,stalled=1%,victims=10%")).met


def test_without_a_target_on_itl_nothing_rests_on_it_and_the_run_meets(runs: dict[int, Path]) -> None:
    judged = judge_run(runs[100], "itl_p99=off", NONE)
    assert judged.met and judged.not_judged == [] and judged.unmeasured == [summary_warning(runs[100])]


def test_a_measured_miss_beside_an_unmeasured_itl_still_counts(runs: dict[int, Path]) -> None:
    """400 ms bursts hold the first token too (TTFT p90 500 ms): a TTFT target of 300 ms is missed on a figure
    that was measured, so the run misses, and is not run again as a disturbed one (TTFT was not in doubt)."""
    judged = judge_run(runs[400], "ttft=300ms", NONE)
    assert not judged.met and judged.disturbed == [] and judged.not_judged == ["ITL p99"]
    assert len(judged.misses) == 1 and judged.misses[0].startswith("chat TTFT") and "> 300 ms" in judged.misses[0]


def test_an_unmeasured_itl_is_not_run_again(runs: dict[int, Path]) -> None:
    """ITL p99 400 ms over its 200 ms target used to be a miss put in doubt (ITL withdrawn), run twice more and
    then counted as missed: the server delivers so at that load, and a rerun measures no more."""
    pt = measure_point(4, "bisect", 1, lambda: judge_run(runs[400], None, NONE))
    assert len(pt.runs) == 1 and not pt.runs[0].rerun
    assert pt.not_judged and not pt.met and not pt.missed
    assert pt.unmeasured == [summary_warning(runs[400])]
