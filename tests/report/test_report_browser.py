"""The HTML report opens in a real browser: no console errors, no network, every figure drawn."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from itlbench.report.run_report import write_run_report
from itlbench.report.style import PREFILL
from tests.support.browser import open_page
from tests.support.report_runs import build_run


def _rgb(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])


def test_report_opens_in_headless_chromium_and_shows_the_stall(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    written = write_run_report(run)
    page = open_page(written.html)
    assert page.errors == [], page.errors
    assert page.requests == [], "the report must not touch the network"
    assert page.title.startswith("chat · inject 8k@4s")
    figures = list((run / "figures").glob("*.png"))
    assert len(page.images) == len(figures) and all(ok and w > 500 for ok, w in page.images), page.images
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot)).convert("RGB")).astype(int)
    assert shot.shape[1] == 1280 and shot.shape[0] >= 1000
    non_white = (shot.sum(axis=2) < 740).mean()
    assert non_white > 0.05, f"screenshot is nearly blank ({non_white:.1%} non-white)"
    colours = (shot[..., 0] << 16) | (shot[..., 1] << 8) | shot[..., 2]  # one int a colour: 1-D unique is fast
    assert len(np.unique(colours)) > 200, "screenshot has almost no colours"
    red = (np.abs(shot - _rgb(PREFILL)).sum(axis=2) < 30).sum()
    assert red > 2_000, "the stall picture's prefill-red band is not on screen"


def test_comparison_report_opens_in_headless_chromium(tmp_path: Path) -> None:
    from itlbench.report.compare import write_compare_report

    runs = [build_run(tmp_path / "long"), build_run(tmp_path / "short", stall_scale=0.1)]
    written, _, _ = write_compare_report(runs, tmp_path / "cmp", "itl_max=500ms")
    page = open_page(written.html)
    assert page.errors == [] and page.requests == [], (page.errors, page.requests)
    assert len(page.images) == 4 and all(ok and w > 500 for ok, w in page.images), page.images
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot)).convert("RGB")).astype(int)
    assert (shot.sum(axis=2) < 740).mean() > 0.05
