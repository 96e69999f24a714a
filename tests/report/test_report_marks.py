"""What a report states, it states truthfully: withdrawn figures marked wherever they appear, the SLOs goodput
was judged against shown, durations written as durations, and figures whose axes and labels read true."""

from __future__ import annotations

import html as html_lib
import json
from pathlib import Path

import polars as pl
import pytest
from matplotlib.text import Annotation
from rich.console import Console

from itlbench.analysis.goodput import parse_slo
from itlbench.report.compare import build_compare_document, make_rows, verdict
from itlbench.report.compare_runs import differing_settings
from itlbench.report.data import RunData, load_run
from itlbench.report.document import FigureSpec, Table
from itlbench.report.durations import fmt_s
from itlbench.report.engines import engine_check_line
from itlbench.report.figures import itl_figure, split_figure, ttft_figure
from itlbench.report.run_report import build_document, headline, injected_prefill_line, write_run_report
from itlbench.report.slos import slo_text
from itlbench.report.steps_figure import engine_steps_figure
from itlbench.report.style import new_figure, seconds_yaxis
from itlbench.report.terminal import open_stall_line, print_summary
from itlbench.report.withdrawn import Withdrawn
from tests.support.report_runs import build_run

CPU = "the client's CPU saturated, so its stamps are late"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _saturate_client(run: Path) -> Path:
    """The client's samples at 90 % of a core: the run's own validity check withdraws TTFT, ITL, stalls, goodput."""
    for part in (run / "client_samples").glob("*.parquet"):
        pl.read_parquet(part).with_columns(pl.lit(90.0).alias("cpu_percent")).write_parquet(part)
    return run


def _terminal(data: RunData) -> str:
    console = Console(record=True, width=240, color_system=None)
    print_summary(console, data.summary, data.run_dir)
    return _flat(console.export_text())


@pytest.fixture(scope="module")
def invalid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _saturate_client(build_run(tmp_path_factory.mktemp("marks") / "invalid"))
    write_run_report(run)
    return run


def test_an_invalid_run_marks_every_withdrawn_figure_where_it_is_stated(invalid: Path) -> None:
    data = load_run(invalid)
    assert data.summary["valid"] is False
    assert data.summary["validity"]["affected"] == ["ttft_s", "itl_s", "stalls", "goodput"]
    html = html_lib.unescape(_flat((invalid / "report.html").read_text()))
    md = (invalid / "report.md").read_text()
    # the verdict comes first, then a headline that flags each withdrawn figure and says why once
    assert html.index("INVALID run") < html.index("While inj-000")
    line = headline(data)
    assert "the worst 1.52 s (not valid). Its own first token came after 1.51 s (not valid)." in line
    assert "Steady streams' ITL (not valid): p50 20 ms" in line
    assert line.endswith("output tokens/s. Not valid: the stalls, inj-000's TTFT, ITL, as the verdict above says "
                         f"({CPU}).")  # throughput still stands: unmarked
    assert '<div class="callout warn">While inj-000' in html
    doc = build_document(data)
    tables = {b.caption: b for s in doc.sections for b in s.blocks if isinstance(b, Table)}
    ttft = tables["TTFT by prompt bucket"]
    assert ttft.withdrawn == CPU and [r[0] for r in ttft.rows] == ["le512 (not valid)", "le8k (not valid)",
                                                                   "all (not valid)"]
    assert ttft.invalid_rows == frozenset({0, 1, 2})
    itl = next(t for c, t in tables.items() if c.startswith("Inter-token latency"))
    assert all(r[0].endswith("(not valid)") for r in itl.rows) and itl.withdrawn == CPU
    totals = next(t for t in tables.values() if t.headers == ["", ""])
    marked = {r[0] for i, r in enumerate(totals.rows) if i in totals.invalid_rows}
    assert marked == {"goodput", "stalls"}
    assert next(r[1] for r in totals.rows if r[0] == "stalls").endswith(f"— not valid: {CPU}")
    assert "not valid" not in next(r[1] for r in totals.rows if r[0] == "output throughput")
    figs = {b.key: b for s in doc.sections for b in s.blocks if isinstance(b, FigureSpec)}
    assert {k for k, f in figs.items() if f.withdrawn} == {"stalls", "ttft", "itl_cdf", "goodput"}
    assert figs["ttft"].figure._suptitle.get_text() == f"NOT VALID: {CPU}"  # on the PNG, which leaves the caption
    assert figs["split"].figure._suptitle is None
    # the same marks in the HTML, the Markdown and on the terminal
    assert f'<span class="withdrawn">Not valid: {CPU}.</span> <b>Time to first token by prompt length.</b>' in html
    assert '<tr class="invalid"><td class="k">le512 (not valid)</td>' in html
    assert f"**Not valid: {CPU}.** **Inter-token latency distribution.**" in md
    assert f"**Not valid: {CPU}.**\n\n*TTFT by prompt bucket*" in md and "| le8k (not valid) |" in md
    out = _terminal(data)
    for figure in ("TTFT", "ITL", "Stalls", "Goodput"):
        assert f"{figure} not valid: {CPU}" in out
    assert "le512 (not valid)" in out and "TTFT 1.51 s (not valid)" in out
    assert "Throughput not valid" not in out and "Prefill:decode not valid" not in out


def test_a_verdict_on_part_of_a_figure_marks_that_part_and_what_pools_it() -> None:
    gone = Withdrawn.of({"valid": False, "validity": {
        "affected": ["ttft_s.le128", "ttft_by_class_s.chat", "goodput", "stalls", "itl_s.max"],
        "reasons": ["TTFT le128: 3 of 8 requests were sent late by at least 10% of their TTFT: the client sent late",
                    "2 stall gaps are the client's own pauses (stalls.by_cause.client): the ITL tail overstates",
                    "a check this report does not know yet: what it found"]}})
    assert gone.why("ttft_s.le512") is None and gone.why("throughput") is None
    assert gone.label("ttft_s.le128", "le128") == "le128 (not valid)"
    assert gone.label("ttft_s", "all") == "all (le128 not valid)"
    assert gone.mark("ttft_s.le128") == ("not valid: the client sent le128 requests late; a check this report does "
                                         "not know yet")
    assert gone.why("ttft_by_class_s.chat", ).startswith("the client sent le128 requests late")
    assert gone.mark("itl_s").startswith("max not valid: the client's own pauses stalled streams")
    assert gone.parts("tpot_s") == ["max"], "the ITL views share their stamps"
    assert not Withdrawn.of({"valid": True, "validity": {"affected": ["itl_s"]}})


def test_goodput_states_the_default_slos_it_was_judged_against(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    data = load_run(run)
    assert data.doc["slo"] is None and data.config["slo"] is None
    write_run_report(run)
    html = html_lib.unescape(_flat((run / "report.html").read_text()))
    targets = ("TTFT le128 ≤ 500 ms, le512 ≤ 1.00 s, le2k ≤ 2.00 s, le8k ≤ 5.00 s, le32k ≤ 15.0 s, gt32k ≤ 60.0 s; "
               "ITL p99 ≤ 200 ms (each request's own gaps)")
    assert ('<td class="k">SLOs judged</td><td>The default SLOs (no --slo given; docs/measures.md, Goodput): '
            f"{targets}</td>") in html
    assert f"Judged against the default SLOs (no --slo given; docs/measures.md, Goodput): {targets}." in html
    assert '<td class="k">slo</td><td>none given: the default SLOs applied' in html  # not '—'
    assert f"judged against the default SLOs (no --slo given; docs/measures.md, Goodput): {targets}" in _terminal(data)
    legend = [t.get_text() for t in itl_figure(data).figure.axes[0].get_legend().get_texts()]
    assert "SLO: each request's ITL p99 ≤ 200 ms (default)" in legend, legend
    given = {"goodput": {"slos": parse_slo("itl_max=500ms,injected/ttft=off").to_dict()}}
    assert slo_text(given) == ("--slo itl_max=500ms,injected/ttft=off over the defaults: TTFT le128 ≤ 500 ms, "
                               "le512 ≤ 1.00 s, le2k ≤ 2.00 s, le8k ≤ 5.00 s, le32k ≤ 15.0 s, gt32k ≤ 60.0 s; "
                               "ITL max ≤ 500 ms (each request's own gaps); for injected: TTFT off in every bucket")


def test_milliseconds_are_written_as_milliseconds(tmp_path: Path) -> None:
    assert [fmt_s(v) for v in (0.0044, 0.00004, 0, 0.99999, 9.999, 14.1)] == [
        "4.4 ms", "40 µs", "0 ms", "1.00 s", "10.0 s", "14.1 s"]
    check = {"longest_step_s": 0.0044, "worst_client_gap_s": 0.0044, "worst_gap_steps": 1,
             "worst_gap_request_id": "s00-000010", "worst_gap_engine_busy_s": 0.0044,
             "worst_gap_longest_step_s": 0.0044, "worst_gap_unexplained_s": 0.0}
    assert engine_check_line(check) == ("worst client gap 4.4 ms (s00-000010): 1 engine step inside it kept the engine "
                                        "busy 4.4 ms, the longest 4.4 ms; 0 ms not engine time; longest step of the "
                                        "run 4.4 ms")
    run = build_run(tmp_path / "run")
    data = load_run(run)
    summary = {**data.summary, "crosscheck": {"engine": {**check, "injected": [
        {"request_id": "inj-000", "prompt_tokens": 1024, "client_ttft_s": 0.0046, "engine_prefill_span_s": 0.0044,
         "prefill_steps": 1}]}}}
    console = Console(record=True, width=240, color_system=None)
    print_summary(console, summary, run)
    out = _flat(console.export_text())
    assert "Engine check worst client gap 4.4 ms" in out
    assert "Injected inj-000 (1,024 tokens): TTFT 4.6 ms; engine prefill 4.4 ms over 1 step" in out
    assert "0.00 s" not in out and "0.01" not in out, out
    assert "le512 4 102 ms" in out  # the TTFT table in durations, not "0.10" under a "(s)" title


def test_the_ttft_axis_is_linear_from_zero_unless_the_values_span_decades(tmp_path: Path) -> None:
    data = load_run(build_run(tmp_path / "run"))  # TTFTs of 102 ms and 1.51 s: under 20x apart
    ax = ttft_figure(data).figure.axes[0]
    ax.figure.canvas.draw()
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0 ms" in ticks and any(t.endswith(" s") for t in ticks), ticks
    assert not any("10^" in t or "$" in t for t in ticks)
    narrow, wide = new_figure(2).subplots(), new_figure(2).subplots()
    assert not seconds_yaxis(narrow, [0.00595, 0.0062]) and narrow.get_ylim()[0] == 0
    assert seconds_yaxis(wide, [0.001, 0.5]) and wide.get_yscale() == "log"


def test_a_far_slo_line_does_not_set_the_itl_range_and_the_counts_match_the_table(tmp_path: Path) -> None:
    data = load_run(build_run(tmp_path / "calm", inject=False))  # every gap 20 ms, the default target 200 ms
    ax = itl_figure(data).figure.axes[0]
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim()
    assert hi < 0.1, f"x range to {hi} s: the 200 ms SLO stretched it"
    assert not [line for line in ax.lines if list(line.get_xdata()) == [0.2, 0.2]], "no SLO line far off the data"
    edge = [t.get_text() for t in ax.texts if isinstance(t, Annotation) and "SLO" in t.get_text()]
    assert edge == ["SLO: each request's ITL p99 ≤ 200 ms (default), off the scale →"]
    ticks = [t.get_text() for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True) if t.get_text()]
    assert len(ticks) >= 2 and all(t.endswith("ms") for t in ticks), ticks
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    tpot = data.summary["tpot_s"]["count"]
    assert f"per request, TPOT (mean gap; n={tpot:,})" in legend, (legend, tpot)


def test_labels_that_would_cover_each_other_are_drawn_once_or_apart(tmp_path: Path) -> None:
    data = load_run(build_run(tmp_path / "run"))  # four equal chunks: the first is (one of) the longest
    ax2 = engine_steps_figure(data).figure.axes[1]
    labels = [t.get_text() for t in ax2.texts if isinstance(t, Annotation)]
    assert labels == ["first and longest chunk: 2,044 tokens, 375 ms"], labels
    data = load_run(build_run(tmp_path / "thin", stall_scale=0.6))  # a prefill of ~10 % of the engine time
    fig = split_figure(data).figure
    fig.canvas.draw()
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    spans = [t.get_window_extent(renderer) for t in ax.texts]
    assert any(t.get_text().startswith("prefill ") and "(1" in t.get_text() for t in ax.texts)
    for s in spans:
        assert box.x0 <= s.x0 and s.x1 <= box.x1, "a label runs out of its bar, over the axis' row labels"
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            assert not a.overlaps(b), "two labels cover each other"


def _stop_at_5s(run: Path) -> Path:
    """As Ctrl-C leaves a run: its window ends 5 s in, and run.json names the signal."""
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**doc, "end_ns": 6_000_000_000, "signal": "SIGINT"}))
    return run


def test_compare_names_the_duration_each_run_measured(tmp_path: Path) -> None:
    whole = build_run(tmp_path / "whole")  # 10 s planned, 10 s measured
    longer = _stop_at_5s(build_run(tmp_path / "longer", duration_s=30.0))
    assert differing_settings([load_run(whole), load_run(longer)]) == [
        "duration (whole: 10 s, longer: 5.00 s measured of 30 s planned)"]  # not 'longer: 30.0'
    # one plan, one run stopped early: compared, and the comparison says which row covers less time
    stopped = _stop_at_5s(build_run(tmp_path / "stopped"))
    runs = [load_run(whole), load_run(stopped)]
    assert differing_settings(runs) == []
    cut = ("Cut short: budget 2048 (stopped): it was stopped by Ctrl-C (SIGINT); it measured 5.00 s of the planned "
           "10 s; its row covers only that.")
    assert cut in verdict(make_rows(runs), parse_slo(None))
    doc = build_compare_document(runs, parse_slo(None))  # and as a warning at the top of the comparison
    assert [c.text for c in doc.callouts if c.level == "warn"] == [cut]


def test_a_bucket_whose_ttft_parts_are_unknown_draws_no_share_bar() -> None:
    """A known client lag beside an unknown queue and prefill is not 100 % of the TTFT."""
    from itlbench.report.figures import _ttft_parts

    t = pl.DataFrame({"bucket": ["le8k", "le8k", "le32k", "le32k"], "client_lag_s": [0.001, 0.001, 0.01, 0.01],
                      "queue_s": [None, None, 0.04, 0.04], "prefill_s": [None, None, 41.0, 41.0],
                      "server_s": [41.0, 41.0, 41.04, 41.04], "ttft_s": [41.001, 41.001, 41.05, 41.05]})
    ax = new_figure(2).subplots()
    _ttft_parts(ax, t, ["le8k", "le32k"], has_steps=True)
    bars = [(round(p.get_y() + p.get_height() / 2), p.get_width()) for p in ax.patches]
    assert bars and {row for row, _ in bars} == {1}, bars  # only le32k (row 1) has a bar
    assert sum(width for _, width in bars) == pytest.approx(1.0)


def test_the_reports_injected_prefill_line_says_1_step_not_1_steps() -> None:
    check = {"request_id": "inj-000", "prompt_tokens": 32768, "client_ttft_s": 1.51, "engine_prefill_span_s": 1.49}
    assert injected_prefill_line(check | {"prefill_steps": 1}) == (
        "inj-000 (32k tokens): client TTFT 1.51 s, engine prefill span 1.49 s over 1 step.")
    assert injected_prefill_line(check | {"prefill_steps": 17}).endswith("over 17 steps.")


def test_the_terminal_counts_one_stall_event_in_the_singular(tmp_path: Path) -> None:
    data = load_run(build_run(tmp_path / "run"))
    stalls = {**data.summary["stalls"], "count": 1, "victims": 1, "events": 1}
    event = {"worst_s": 0.059, "victims": 1, "stalled_s": 0.059, "cause": "client", "longest_step_s": 0.0052}
    console = Console(record=True, width=240, color_system=None)
    print_summary(console, {**data.summary, "stalls": {**stalls, "attribution": [event]}}, data.run_dir)
    out = _flat(console.export_text())
    assert "1 gap," in out and "1 victim request, 1 event" in out, out
    assert "• worst 59 ms across 1 request (59 ms stalled" in out


def test_an_open_stall_is_not_said_never_to_have_resumed() -> None:
    """Open means no token closed the gap inside the window: the stream may have resumed just after it."""
    line = open_stall_line({"open": {"count": 31, "stalled_s": 15.1, "at_window_end": 31}})
    assert line is not None and "never resumed" not in line
    assert line.startswith("31 of them open (15.1 s stalled): no token ended them in the window; 31 still stalled")


def test_the_step_duration_axis_reads_as_durations(tmp_path: Path) -> None:
    """'375 ms' and '1.00 s' on the ticks, as the docs promise for every tick label, not '5000' under '(ms)'."""
    fig = engine_steps_figure(load_run(build_run(tmp_path / "run"))).figure
    fig.canvas.draw()
    ax2 = fig.axes[1]
    ticks = [t.get_text() for t in ax2.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith((" ms", " s", " µs")) for t in ticks), ticks
    assert ax2.get_ylabel() == "step duration"


def test_the_first_chunks_label_stays_inside_the_axes_near_its_left_edge() -> None:
    """A first chunk 5 s into a 52 s view: its label leaning left covered the tick labels ('250')."""
    from itlbench.report.steps_figure import _early_lean

    assert _early_lean(5.2, 0.0, 52.0) == ("left", 4)
    assert _early_lean(30.0, 0.0, 52.0) == ("right", -4)


def test_the_ttft_tables_key_to_its_dash_shows_only_under_a_dash(tmp_path: Path) -> None:
    """"— : too few requests" explained a mark a full table (a 600 s trace replay) did not show."""
    data = load_run(build_run(tmp_path / "run"))
    full = {"count": 200, "p50": 0.1, "p90": 0.2, "p99": 0.3, "max": 0.4}
    key = "too few requests for that percentile"
    for buckets, shown in (({"le512": full, "all": full}, False),
                           ({"le512": full, "le2k": {**full, "count": 5, "p90": None, "p99": None}, "all": full}, True)):
        console = Console(record=True, width=240, color_system=None)
        print_summary(console, {**data.summary, "ttft_s": buckets}, data.run_dir)
        assert (key in console.export_text()) is shown


def test_late_sends_in_two_buckets_are_one_reason() -> None:
    """'the client sent le2k requests late; the client sent le512 requests late' under goodput read as two causes."""
    summary = {"valid": False, "validity": {
        "reasons": ["TTFT le2k: 1 of 16 requests were sent late by at least 10% of their TTFT",
                    "TTFT le512: 1 of 38 requests were sent late by at least 10% of their TTFT",
                    "client event-loop lag p99 40 ms"],
        "affected": ["ttft_s.le2k", "ttft_s.le512", "goodput", "itl_s"]}}
    gone = Withdrawn.of(summary)
    assert gone.why("goodput") == ("the client sent le2k and le512 requests late; the client's event loop ran late, "
                                   "so chunk stamps are late")
    assert gone.why("ttft_s.le512") == "the client sent le512 requests late"
