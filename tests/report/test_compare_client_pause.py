"""`compare`/`sweep` rank the smoothest setting by the worst gap the client's own pauses did not make
(`itl_s.max_not_client`), and say so where that differs from the worst gap as measured.

vLLM-CPU at max_num_seqs 2 and 8: the worst gap of 2 was a 333 ms pause of the harness's event loop, and the ranking
by worst gap named 8 smoothest though 2's ITL p99 was 11 ms against 43 ms. A revert (4e3e62b) showed the other
side: a run whose worst gap is a real 16 s prefill freeze must still rank last, whatever else its client did."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from itlbench.analysis.goodput import parse_slo
from itlbench.report.compare import Row, make_rows, verdict
from itlbench.report.compare_pick import answer
from itlbench.report.compare_runs import load_runs
from tests.support.report_runs import build_run

PAUSED = {"valid": False, "validity": {
    "reasons": ["40 stall gaps are the client's own pauses (stalls.by_cause.client): the ITL tail overstates the "
                "server's"], "affected": ["stalls", "itl_s.max"]}}
NO_SLOS = parse_slo("ttft=off,itl_p99=off")


def _rows(tmp_path: Path, figures: dict[str, tuple[float, float | None, float]]) -> list[Row]:
    """One row per label from (worst gap, worst gap not the client's — None: a summary written before it — ITL p99);
    a run whose two gaps differ is marked as validity marks a client's pause."""
    base = load_runs([build_run(tmp_path / "run")])[0]
    runs = []
    for worst, calm, p99 in figures.values():
        itl = {k: v for k, v in base.summary["itl_s"].items() if k != "max_not_client"}
        itl.update({"max": worst, "p99": p99}, **({} if calm is None else {"max_not_client": calm}))
        summary = {**base.summary, "itl_s": itl, "stalls": {**base.summary["stalls"], "worst_s": None}}
        runs.append(replace(base, summary={**summary, **(PAUSED if calm is not None and calm < worst else {})}))
    rows = make_rows(runs)
    for row, label in zip(rows, figures, strict=True):
        row.label = row.group = label
    return rows


def _smoothest(rows: list[Row]) -> str:
    return next(line for line in verdict(rows, NO_SLOS) if line.startswith("Smoothest"))


def _pick(rows: list[Row]) -> str:
    """The answer's line: where it picks the smoothest setting, it gives the figures that ranked it (the verdict's
    'Smoothest streams' line then only names it)."""
    said = answer(rows, NO_SLOS)
    assert said is not None
    return said


def test_a_client_pause_does_not_outrank_the_servers_worst_gap(tmp_path: Path) -> None:
    rows = _rows(tmp_path, {"seqs2": (0.333, 0.045, 0.011), "seqs8": (0.120, 0.120, 0.043)})
    assert [r.rank_s() for r in rows] == [0.045, 0.120] and rows[0].paused() and not rows[1].paused()
    line, pick = _smoothest(rows), _pick(rows)
    assert pick.startswith("Pick seqs2: the smoothest setting, no SLO being judged (worst gap 45 ms not counting the "
                           "client's own pauses, 333 ms with them; ITL p99 11 ms;"), pick
    assert line.startswith("Smoothest streams: seqs2, the pick."), line
    assert "not valid" not in line + pick  # the withdrawn figure is the 333 ms pause, not the one that ranked


def test_a_summary_without_the_figure_ranks_by_the_worst_gap(tmp_path: Path) -> None:
    """Run directories analysed before `itl_s.max_not_client` existed rank as they did."""
    rows = _rows(tmp_path, {"seqs2": (0.333, None, 0.011), "seqs8": (0.120, None, 0.043)})
    assert _pick(rows).startswith("Pick seqs8: the smoothest setting, no SLO being judged (worst gap 120 ms, ITL p99 "
                                  "43 ms;")
    assert _smoothest(rows).startswith("Smoothest streams: seqs8, the pick.")


def test_a_real_prefill_freeze_still_ranks_last(tmp_path: Path) -> None:
    """Unchunked, a 16 s prefill froze every stream while the client also paused somewhere: the freeze is the
    server's, so `max_not_client` keeps it and the tiny budget stays smoothest."""
    rows = _rows(tmp_path, {"budget 16": (0.200, 0.200, 0.030), "unchunked": (16.0, 16.0, 0.020)})
    rows[1].run.summary.update(PAUSED)  # validity withdrew its itl_s.max: a client pause elsewhere in the run
    assert _pick(rows).startswith("Pick budget 16: the smoothest setting, no SLO being judged (worst gap 200 ms, ITL "
                                  "p99 30 ms;")
    assert _smoothest(rows).startswith("Smoothest streams: budget 16, the pick.")


def test_the_verdict_names_the_other_runs_whose_worst_gap_was_a_pause(tmp_path: Path) -> None:
    rows = _rows(tmp_path, {"seqs2": (0.333, 0.045, 0.011), "seqs8": (0.500, 0.120, 0.043),
                            "seqs16": (0.090, 0.090, 0.060)})
    line = _smoothest(rows)
    assert line.startswith("Smoothest streams: seqs2, the pick."), line
    assert ("Ranked not counting the client's own pauses, which made the worst gap of seqs8 (500 ms; 120 ms "
            "without them).") in line, line


def _repeats(tmp_path: Path, settings: dict[str, list[tuple[float, float | None]]]) -> list[Row]:
    """Repeats of each setting, one row per (worst gap, worst gap not the client's) run, grouped as a sweep's."""
    rows = _rows(tmp_path, {f"{name} (#{i})": (worst, calm, 0.02) for name, runs in settings.items()
                            for i, (worst, calm) in enumerate(runs, 1)})
    for row in rows:
        row.group = row.label.rsplit(" (#", 1)[0]
    return rows


def _noise_line(rows: list[Row]) -> str:
    return next(line for line in verdict(rows, NO_SLOS) if line.startswith(("Smoothest", "No setting has")))


def test_repeats_rank_by_the_mean_worst_gap_not_the_clients(tmp_path: Path) -> None:
    """With --repeat the smoothest setting was still ranked by the mean raw worst gap: seqs2's client pauses
    (333 ms, 300 ms, 310 ms) named seqs8 smoother, as one run per setting no longer does."""
    rows = _repeats(tmp_path, {"seqs2": [(0.333, 0.045), (0.300, 0.046), (0.310, 0.047)],
                               "seqs8": [(0.120, 0.120), (0.121, 0.121), (0.122, 0.122)]})
    line = _noise_line(rows)
    assert line.startswith("Smoothest streams: seqs2 (worst gap 46 ms [45 ms, 47 ms] not counting the client's own "
                           "pauses, 314 ms ["), line
    assert "with them, over 3 runs), significantly below seqs8 (121 ms [120 ms, 122 ms])." in line, line


def test_repeats_within_noise_say_both_figures_of_a_paused_setting(tmp_path: Path) -> None:
    rows = _repeats(tmp_path, {"seqs2": [(0.333, 0.045), (0.300, 0.050)], "seqs8": [(0.120, 0.120), (0.125, 0.125)]})
    line = _noise_line(rows)
    assert line.startswith("No setting has significantly smoother streams: seqs2 (worst gap 48 ms [45 ms, 50 ms] not "
                           "counting the client's own pauses, 316 ms [300 ms, 333 ms] with them) and seqs8 (122 ms "
                           "[120 ms, 125 ms]) are within noise (too few runs"), line


def test_a_setting_whose_repeat_lacks_the_figure_ranks_by_its_worst_gap(tmp_path: Path) -> None:
    """One run of seqs2 was analysed before `itl_s.max_not_client`: its setting ranks on the worst gap of every run
    (a mean over some runs of one figure and some of another would rank on neither), so seqs8 is smoother."""
    rows = _repeats(tmp_path, {"seqs2": [(0.333, 0.045), (0.300, None), (0.310, 0.047)],
                               "seqs8": [(0.120, 0.120), (0.121, 0.121), (0.122, 0.122)]})
    line = _noise_line(rows)
    assert line.startswith("Smoothest streams: seqs8 (worst gap 121 ms [120 ms, 122 ms] over 3 runs), significantly "
                           "below seqs2 (314 ms ["), line
    assert "not counting" not in line


def test_compare_json_carries_the_figure_per_run_and_per_setting(tmp_path: Path) -> None:
    """compare.json's rows give the figure that ranked each run beside its worst gap, and ci95 its interval."""
    import json

    from itlbench.report.compare import write_compare_report

    dirs = [build_run(tmp_path / "long"), build_run(tmp_path / "short", stall_scale=0.1)]
    write_compare_report(dirs, tmp_path / "cmp")
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    summaries = [run.summary for run in load_runs(dirs)]
    assert [r["worst_gap_not_client_s"] for r in doc["rows"]] == [s["itl_s"]["max_not_client"] for s in summaries]
    assert all(r["worst_gap_not_client_s"] is not None for r in doc["rows"])
    first = doc["ci95"][doc["rows"][0]["group"]]["worst_gap_not_client_s"]
    assert first["mean"] == doc["rows"][0]["worst_gap_not_client_s"] and first["n"] == 1
