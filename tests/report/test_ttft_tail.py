"""The TTFT figure's right panel shows the slow requests beside the median: in a simulated run with a full batch,
le512's median was 62 ms (mostly prefill) but its p90 2.06 s, nearly all queueing, and a median-only bar said
"mostly prefill"."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import polars as pl
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg

from itlbench.report.data import load_run
from itlbench.report.figures import ttft_figure
from itlbench.report.style import new_figure
from itlbench.report.ttft_parts import HEIGHT, OFFSET, tail_rows, ttft_parts
from tests.support.report_runs import build_run

QUEUE, PREFILL = "#f2a900", "#e45756"


def _table(buckets: dict[str, int]) -> pl.DataFrame:
    """Per bucket n requests: nine in ten prefill 45 ms after a 15 ms queue, every tenth queues 2.015 s."""
    rows = []
    for b, n in buckets.items():
        for k in range(n):
            queue = 2.015 if k % 10 == 9 else 0.015
            rows.append({"bucket": b, "client_lag_s": 0.001, "queue_s": queue, "prefill_s": 0.045,
                         "server_s": queue + 0.045, "ttft_s": 0.001 + queue + 0.045, "injected": False})
    return pl.DataFrame(rows)


def _segments(ax: Axes) -> dict[float, dict[str, float]]:
    """The drawn bars: per bar centre (y), each colour's width."""
    out: dict[float, dict[str, float]] = {}
    for p in ax.patches:
        y = round(p.get_y() + p.get_height() / 2, 3)
        color = "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in p.get_facecolor()[:3]))
        out.setdefault(y, {})[color] = p.get_width()
    return out


def test_the_tail_bar_says_queueing_where_the_median_says_prefill_and_a_small_bucket_has_none() -> None:
    ax = new_figure(3).subplots()
    ttft_parts(ax, _table({"le512": 20, "le8k": 9}), ["le512", "le8k"], has_steps=True)
    bars = _segments(ax)
    assert set(bars) == {-OFFSET, OFFSET, 1 - OFFSET}, bars  # le8k (9 requests) draws its median bar only
    median, slow = bars[-OFFSET], bars[OFFSET]
    assert median[PREFILL] == pytest.approx(0.045 / 0.061) and median[QUEUE] == pytest.approx(0.015 / 0.061)
    assert slow[QUEUE] == pytest.approx(2.015 / 2.061) and slow[PREFILL] < 0.05, slow
    assert all(p.get_height() == pytest.approx(HEIGHT) for p in ax.patches)
    labels = {round(t.get_position()[1], 3): t.get_text() for t in ax.get_yticklabels(minor=True)}
    assert labels == {-OFFSET: "median", OFFSET: "slowest 10 % (≥2.06 s)", 1 - OFFSET: "median",
                      1 + OFFSET: "slowest 10 %: n<10"}, labels
    assert [t.get_text() for t in ax.get_yticklabels()] == ["le512", "le8k"]


def test_six_buckets_of_paired_bars_keep_every_label_apart_and_inside_the_figure(tmp_path: Path) -> None:
    run = load_run(build_run(tmp_path / "run", inject=False))
    buckets = ("le128", "le512", "le2k", "le8k", "le32k", "gt32k")
    table = _table(dict(zip(buckets, (12, 30, 9, 10, 40, 11), strict=True)))
    spec = ttft_figure(dataclasses.replace(run, ttft=table))
    assert "slowest 10 %" in spec.caption and "⌈n/10⌉ longest TTFTs" in spec.caption
    fig = spec.figure
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()
    right = fig.axes[1]
    groups = [t.get_window_extent(renderer) for t in right.get_yticklabels(minor=True)]
    names = [t.get_window_extent(renderer) for t in right.get_yticklabels()]
    assert len(groups) == 12 and len(names) == 6
    edge, inside = fig.bbox, right.get_window_extent(renderer)
    for a, b in itertools.combinations(groups + names, 2):
        assert not a.overlaps(b), (a, b)
    for box in groups + names:
        assert edge.x0 <= box.x0 and box.x1 <= inside.x0 and inside.y0 - 1 <= box.y0 and box.y1 <= inside.y1 + 1, box


def test_the_slowest_tenth_is_counted_by_rank_not_by_ties_at_the_p90() -> None:
    """Twelve requests, eleven tied at 61 ms: every one is "at or above p90" (61 ms), none of them slow."""
    rows = _table({"le128": 12})
    slow = tail_rows(rows)
    assert slow is not None and slow["ttft_s"].to_list() == [pytest.approx(2.061), pytest.approx(0.061)]
    assert tail_rows(rows.head(9)) is None


def test_a_bucket_of_one_request_draws_no_median_as_its_table_row_withholds_its_p50() -> None:
    """vLLM-CPU's le8k held the one injected prompt: the table said p50 "—" while the figure drew its "median"."""
    ax = new_figure(3).subplots()
    ttft_parts(ax, _table({"le512": 20, "le8k": 1}), ["le512", "le8k"], has_steps=True)
    assert set(_segments(ax)) == {-OFFSET, OFFSET}
    labels = {round(t.get_position()[1], 3): t.get_text() for t in ax.get_yticklabels(minor=True)}
    assert labels[1 - OFFSET] == "median: n<2" and labels[1 + OFFSET] == "slowest 10 %: n<10"


def test_the_caption_says_the_servers_part_is_not_split_without_a_step_log(tmp_path: Path) -> None:
    """Against vLLM the right panel drew client lag and the server's part while the caption named a queue and a
    prefill, and the full batch's "tail queueing" no bar there could show."""
    run = load_run(build_run(tmp_path / "run"))
    assert run.engine.has_steps and "(client lag, server queue, prefill)" in ttft_figure(run).caption
    blind = dataclasses.replace(run, engine=dataclasses.replace(run.engine, source="client only (no step log was recorded)"))
    caption = ttft_figure(blind).caption
    assert "the server's queue and prefill together: no step log splits them" in caption
    assert "tail queueing" not in caption
