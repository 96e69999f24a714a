"""What an engineer reads off a report is there to be read: no label over the bars or the curves it names, none
past the figure's edge, tick labels where the data lie, and every figure printed as summary.json has it."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from itlbench.report import timeline
from itlbench.report.data import RunData, load_run
from itlbench.report.document import Table, _html_table
from itlbench.report.durations import fmt_s
from itlbench.report.figures import itl_figure, throughput_figure, ttft_figure
from itlbench.report.run_report import _verdict
from itlbench.report.run_tables import EVENT_ROWS, events_table
from itlbench.report.steps_figure import engine_steps_figure
from itlbench.report.style import fit_labels, new_figure, seconds_log_xaxis
from itlbench.report.timeline import InjectedSpan, stall_picture
from tests.support.report_runs import build_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunData:
    """The hand-built run: four streams, an 8k prompt prefilled in four chunks from 4 s into a 10 s window."""
    return load_run(build_run(tmp_path_factory.mktemp("legible") / "run"))


def _drawn(fig: Figure) -> FigureCanvasAgg:
    """The figure laid out and drawn as savefig draws it."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas


def _box(artist: Text | Axes, canvas: FigureCanvasAgg) -> Bbox:
    return artist.get_window_extent(canvas.get_renderer())


def _labels(ax: Axes, minor: bool = False) -> list[str]:
    """The tick labels of the x axis that are drawn: a text, and inside the view."""
    lo, hi = ax.get_xlim()
    return [t.get_text() for t in ax.get_xticklabels(minor=minor) if t.get_text() and lo <= t.get_position()[0] <= hi]


def test_the_valid_run_banner_states_the_summary_figures(run: RunData) -> None:
    """It read "send lag at most 6.1 ms over 0 requests" (a misspelt key) and "event-loop lag p99 —" for a short
    run whose summary judged the loop lag at p90."""
    f = run.summary["validity"]["figures"]
    assert f["requests_with_send_lag"] > 0 and f["loop_lag_p99_s"] is None and f["loop_lag_stat"] == "p90"
    text = _verdict(run.summary).text
    assert f"send lag at most {fmt_s(f['send_lag_max_s'])} over {f['requests_with_send_lag']} requests" in text, text
    assert f"event-loop lag p90 {fmt_s(f['loop_lag_s'])}" in text and "p99 —" not in text, text


def test_a_prefill_late_in_the_window_keeps_its_label_inside_and_the_rows_full_width(
        run: RunData, monkeypatch: pytest.MonkeyPatch) -> None:
    """A label from where the prefill began ran past the figure's right edge, and the layout shrank every row to
    make room for it (the streams took 70 % of the width)."""
    late = [InjectedSpan("inj-000", 9.3, 9.9, 8192, 4, 0.6)]
    monkeypatch.setattr(timeline, "injected_spans", lambda data, whole_run=False: late)
    fig = stall_picture(run)
    canvas = _drawn(fig)
    top = fig.axes[0]
    (label,) = [t for t in top.texts if t.get_text().startswith("inj-000")]
    rows, text = _box(top, canvas), _box(label, canvas)
    assert rows.x0 - 0.5 <= text.x0 and text.x1 <= rows.x1 + 0.5, (text, rows)
    assert rows.width > 0.85 * fig.bbox.width, (rows.width, fig.bbox.width)
    assert not text.overlaps(_box(top.title, canvas))


def test_labels_kept_inside_are_also_kept_apart() -> None:
    fig = new_figure(3.0)
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    first = ax.annotate("first chunk: 2,016 tokens, 381 ms", xy=(9.8, 5), xytext=(4, 12), textcoords="offset points")
    second = ax.annotate("longest chunk: 2,016 tokens, 1.15 s", xy=(9.9, 5), xytext=(4, 12),
                         textcoords="offset points")
    fit_labels(fig, ax, [first, second])
    canvas = _drawn(fig)
    inside = _box(ax, canvas)
    boxes = [_box(t, canvas) for t in (first, second)]
    assert all(inside.x0 - 0.5 <= b.x0 and b.x1 <= inside.x1 + 0.5 for b in boxes), (boxes, inside)
    assert not boxes[0].overlaps(boxes[1]), boxes


def test_the_engine_steps_name_the_window_end_and_budget_in_the_legend_not_over_the_bars(tmp_path: Path) -> None:
    """A prefill that outlasts the window: "end of the measured window" was written across its bars, and the budget's
    label sat on the bars that fill it. Both are in the legend now; the chunk labels stay inside the axes."""
    data = load_run(build_run(tmp_path / "late", stall_scale=4.5))  # the prefill runs 0.75 s past the window's end
    spec = engine_steps_figure(data)
    canvas = _drawn(spec.figure)
    ax, ax2 = spec.figure.axes
    legend = [t.get_text() for t in spec.figure.legends[0].get_texts()]
    assert {"end of the measured window", "token budget 2,048"} <= set(legend), legend
    assert [line.get_xdata()[0] for line in ax.lines if line.get_label() == "end of the measured window"] == [
        pytest.approx(data.window.seconds)]
    bars = [c for c in ax.collections if len(c.get_paths())]
    covered = [t.get_text() for t in ax.texts if any(_box(t, canvas).overlaps(b.get_window_extent()) for b in bars)]
    assert covered == [], covered
    inside = _box(ax2, canvas)
    for label in ax2.texts:
        box = _box(label, canvas)
        assert inside.x0 - 0.5 <= box.x0 and box.x1 <= inside.x1 + 0.5 and box.y1 <= inside.y1 + 0.5, label


def test_a_log_gap_axis_labels_ticks_where_the_gaps_lie_and_never_crowds_them() -> None:
    """Gaps from 15 ms to 1.5 s on a report-wide axis read "100 ms" and "1.00 s" alone: the 20–50 ms where most
    gaps lay had no label. A decade drawn long enough labels its 2s and 5s; the labels never touch."""
    fig = new_figure(3.4)
    ax = fig.subplots()
    ax.plot([0.015, 1.5], [0, 1])
    seconds_log_xaxis(ax)
    canvas = _drawn(fig)
    assert {"20 ms", "50 ms", "200 ms", "500 ms"} <= set(_labels(ax, minor=True)), _labels(ax, minor=True)
    shown = [t for t in (*ax.get_xticklabels(), *ax.get_xticklabels(minor=True))
             if t.get_text() and t.get_text() in _labels(ax) + _labels(ax, minor=True)]
    boxes = sorted((_box(t, canvas) for t in shown), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes)), [(b.x0, b.x1) for b in boxes]
    narrow = new_figure(3.4, width_in=2.5).subplots()  # the same span a fifth as wide: the decades alone
    narrow.plot([0.015, 1.5], [0, 1])
    seconds_log_xaxis(narrow)
    _drawn(narrow.figure)
    assert _labels(narrow, minor=True) == []


def test_ttft_medians_are_written_under_their_bucket_as_summary_json_has_them(tmp_path: Path) -> None:
    """The medians' labels sat on the bars among the dots and could not be read; on a log axis each median was a
    bar from the axis' arbitrary floor, whose length compared nothing."""
    data = load_run(build_run(tmp_path / "long", stall_scale=2.0))  # TTFTs of 102 ms and 3.01 s: 30x apart
    spec = ttft_figure(data)
    left = spec.figure.axes[0]
    _drawn(spec.figure)
    assert left.get_yscale() == "log"
    assert not [p for p in left.patches if isinstance(p, Rectangle)], "a bar on a log axis"
    ticks = [t.get_text() for t in left.get_xticklabels()]
    for tick in ticks:  # the lone injected prompt's bucket has no p50 (one request supports none): "—", no mark
        bucket = tick.split("\n")[0]
        stats = data.summary["ttft_s"][bucket]
        assert tick == f"{bucket}\np50 {fmt_s(stats['p50'])}\nn={stats['count']:,}", tick
    assert "le8k\np50 —\nn=1" in ticks and len(left.collections) == 2 + 1, left.collections  # dots ×2, one median
    assert not left.texts and "as a line across the bucket" in spec.caption


def test_the_itl_maximum_is_drawn_whole_and_the_slo_is_named_in_the_legend(run: RunData) -> None:
    """The max sat on the axis' top edge, its marker cut in half; the target's label ran up the line across the
    curves."""
    fig = itl_figure(run).figure
    canvas = _drawn(fig)
    ax = fig.axes[0]
    top = _box(ax, canvas).y1
    mark = max((line for line in ax.lines if line.get_marker() == "o"), key=lambda line: line.get_ydata()[0])
    assert mark.get_xdata()[0] == pytest.approx(run.summary["itl_s"]["max"])
    y = ax.transData.transform((mark.get_xdata()[0], mark.get_ydata()[0]))[1]
    assert y + mark.get_markersize() / 2 * fig.dpi / 72 < top, (y, top)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "SLO: each request's ITL p99 ≤ 200 ms (default)" in legend, legend
    assert not [t for t in ax.texts if t.get_rotation() == 90]


def test_the_mean_throughput_is_named_in_the_legend_as_summary_json_has_it(run: RunData) -> None:
    fig = throughput_figure(run).figure
    _drawn(fig)
    mean = run.summary["throughput"]["output_tokens_per_s"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"mean {mean:,.0f} output tokens/s" in legend, legend
    assert not fig.axes[0].texts, "a label among the bars"


def test_the_completed_requests_line_counts_every_request_done_by_each_moment(run: RunData) -> None:
    """The green line is 'the requests completed so far': at every moment of the window, the ok requests done by
    then (it was drawn one 1 s bin late, so the last bin's completions never showed: 68 of 70 at the end)."""
    import numpy as np
    import polars as pl

    fig = throughput_figure(run).figure
    xs, ys = (np.asarray(v, dtype=float) for v in fig.axes[1].get_lines()[0].get_data())
    ok = run.tables["requests"].filter(pl.col("status") == "ok").drop_nulls("done_ns")
    done = np.sort((ok["done_ns"] - run.t0_ns).to_numpy() / 1e9)
    done = done[(done >= 0) & (done < run.window.seconds)]
    assert len(done) >= 3
    for t in np.linspace(0, run.window.seconds, 97, endpoint=False)[1:]:
        i = int(np.searchsorted(xs, t, side="right")) - 1
        assert (ys[i] if i >= 0 else 0) == np.count_nonzero(done <= t), t
    assert xs[-1] == pytest.approx(run.window.seconds) and ys[-1] == len(done)


def test_the_events_table_counts_requests_and_says_how_many_events_it_leaves_out(run: RunData) -> None:
    stalls = run.summary["stalls"]
    event = stalls["attribution"][0]
    table = events_table(run)
    assert table is not None and table.headers[1] == "requests" and table.rows[0][1] == str(event["victims"])
    many = {**run.summary, "stalls": {**stalls, "events": 13, "attribution": [event] * 10}}
    shown = events_table(dataclasses.replace(run, summary=many))
    assert shown is not None and len(shown.rows) == EVENT_ROWS
    assert shown.caption.endswith(f"({EVENT_ROWS} of 13)"), shown.caption


def test_a_key_value_table_has_no_blank_header_and_figures_do_not_wrap() -> None:
    from itlbench.report.document import CSS

    html = _html_table(Table(["", ""], [["requests (window)", "31"]], align_right_from=9))
    assert "<thead>" not in html and "<th>" not in html
    assert "<thead><tr><th>bucket</th>" in _html_table(Table(["bucket", "p50"], [["le8k", "160 ms"]]))
    assert "td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}" in CSS


def test_ttft_figure_gives_every_bucket_a_full_slot_and_reads_shares_in_percent(tmp_path: Path) -> None:
    """A one-request bucket at the right edge kept only a sliver of the axes (its label at the border); the share
    axis read 0-1 where the prefill:decode split reads %."""
    data = load_run(build_run(tmp_path / "run"))
    left, right = ttft_figure(data).figure.axes[:2]
    n = len(left.get_xticks())
    assert left.get_xlim() == (-0.5, n - 0.5)
    right.figure.canvas.draw()
    assert [t.get_text() for t in right.get_xticklabels()][-1] == "100%"


def test_the_stalls_row_counts_events_as_the_brief_line_does_and_groups_thousands(run: RunData) -> None:
    """It read "542 gaps … by cause: prefill 1524": no events (the brief line's count) and no separators."""
    from itlbench.report.run_tables import totals_table

    run = dataclasses.replace(run, summary={**run.summary, "stalls": dict(run.summary["stalls"])})
    s = run.summary["stalls"]
    s.update(count=1524, events=17, victims=1200, by_cause={"prefill": {"count": 1524, "stalled_s": 9.0}})
    (row,) = [r for r in totals_table(run).rows if r[0] == "stalls"]
    assert row[1].startswith("17 events (1,524 gaps), ") and "1,200 requests; by cause: prefill 1,524" in row[1], row


def test_a_run_that_ended_before_its_window_opened_draws_its_steps_without_a_warning(tmp_path: Path) -> None:
    """A run that failed in its warm-up (orchestrate._window: its end before measure start) has a 0 s window: the
    steps figure set an x axis from 0 to 0, and matplotlib printed a UserWarning into the terminal."""
    import json
    import warnings

    run = build_run(tmp_path / "run", inject=False)  # no prefill to zoom to: the figure spans the window
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(doc | {"end_ns": doc["measure_start_ns"]}))
    data = load_run(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = engine_steps_figure(data)
    assert spec.figure is not None
