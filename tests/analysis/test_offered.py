"""The offered rate of an open-loop run: the feed's arrivals scheduled in the measured window over its length,
beside the nominal --rate; closed-loop streams, injections and arrivals outside the window do not count."""

from __future__ import annotations

import polars as pl
import pytest

from itlbench.analysis.offered import offered_load, steady_duration_s
from itlbench.analysis.summary import summarize
from itlbench.analysis.window import RunWindow
from itlbench.rundir.schema import empty

S = 1_000_000_000
WINDOW = RunWindow(0, 5 * S, 15 * S)  # 5 s warm-up, then a 10 s window


def _requests(rows: list[tuple[str, int | None, bool, float, str]]) -> pl.DataFrame:
    """(request_id, stream, injected, scheduled at (s from run start), status) → request records."""
    return pl.DataFrame({"request_id": [r[0] for r in rows], "stream": [r[1] for r in rows],
                         "injected": [r[2] for r in rows], "scheduled_ns": [int(r[3] * S) for r in rows],
                         "status": [r[4] for r in rows]},
                        schema={"request_id": pl.Utf8, "stream": pl.Int64, "injected": pl.Boolean,
                                "scheduled_ns": pl.Int64, "status": pl.Utf8})


HAND_BUILT = _requests([
    ("o-0", None, False, 4.9, "ok"),  # warm-up: before the window
    ("o-1", None, False, 5.0, "ok"),  # the window's first instant counts
    *[(f"o-{i}", None, False, 5.0 + i * 0.4, "ok") for i in range(2, 24)],  # 22 more inside
    ("o-24", None, False, 14.9, "error"),  # inside, failed: offered, not achieved
    ("o-25", None, False, 14.95, "timeout"),
    ("o-26", None, False, 15.0, "cancelled"),  # at the window's end: outside
    ("s00-1", 0, False, 6.0, "ok"),  # a closed-loop stream's request
    ("inj-001", None, True, 10.0, "ok"),  # an injection
])


def test_the_offered_rate_counts_the_feeds_arrivals_inside_the_window() -> None:
    out = offered_load(HAND_BUILT, WINDOW, {"rate": 4.0, "burstiness": 1.0, "seed": 0})
    assert out is not None
    assert (out["arrivals"], out["completed"], out["window_s"]) == (25, 23, 10.0)
    assert out["offered_rps"] == pytest.approx(2.5) and out["achieved_rps"] == pytest.approx(2.3)
    assert out["expected_arrivals"] == pytest.approx(40) and out["shortfall"] == pytest.approx(0.375)
    assert out["count_noise"] == pytest.approx(40 ** -0.5)
    assert out["line"] == "Offered 2.5 req/s of the nominal 4.0 (25 arrivals in 10.0 s); achieved 2.3 req/s (23 completed)"
    assert "38% below the nominal rate" in str(out["note"]) and "--duration 100s" in str(out["note"])
    assert "--seed 0's arrivals put 25 in the window" in str(out["note"])


def test_within_ten_percent_there_is_no_note_and_a_closed_loop_run_has_no_offered_rate() -> None:
    near = offered_load(HAND_BUILT, WINDOW, {"rate": 2.7})  # 2.5 offered: 7 % below
    assert near is not None and near["note"] is None and near["shortfall"] == pytest.approx(1 - 2.5 / 2.7)
    assert offered_load(HAND_BUILT, WINDOW, {"rate": None, "streams": 32}) is None
    assert offered_load(HAND_BUILT, WINDOW, None) is None
    trace = offered_load(HAND_BUILT, WINDOW, {"rate": None, "trace": {"rows": 30}})
    assert trace is not None and trace["nominal_rps"] is None and trace["offered_rps"] == pytest.approx(2.5)
    assert str(trace["line"]).startswith("Offered 2.5 req/s by the trace (25 arrivals in 10.0 s)")


def test_burstier_arrivals_need_a_longer_window_for_the_same_settling() -> None:
    assert steady_duration_s(4.0) == 100 and steady_duration_s(4.0, burstiness=0.5) == 200
    assert steady_duration_s(7.0) == 60  # 57 s, rounded up to whole tens


def test_the_summary_carries_it_for_an_open_loop_plan_only() -> None:
    full = HAND_BUILT.with_columns(*[pl.lit(None, dtype=t).alias(c) for c, t in empty("requests").schema.items()
                                     if c not in HAND_BUILT.columns]).select(empty("requests").columns)
    assert summarize({"requests": full}, WINDOW, plan={"rate": 4.0})["offered"]["arrivals"] == 25  # type: ignore[index]
    assert summarize({"requests": full}, WINDOW, plan={"streams": 32, "rate": None})["offered"] is None


def test_agent_sessions_at_a_rate_offer_sessions_counted_by_their_first_turns() -> None:
    rows = [("s00-1", 0, False, 6.0, "ok", "s00-sess-00000", 0)]  # a --streams session: closed loop, not arriving
    for i in range(8):  # eight sessions arrive in the window, each on its stream from 1, three turns each
        rows += [(f"o-sess-{i}-t{k}", 1 + i, False, 5.5 + i + k * 0.3, "ok", f"o-sess-{i}", k) for k in range(3)]
    reqs = _requests([r[:5] for r in rows]).with_columns(pl.Series("turn", [r[6] for r in rows], dtype=pl.Int64))
    out = offered_load(reqs, WINDOW, {"rate": 1.0, "sessions": {"rate": 1.0, "first_stream": 1}})
    assert out is not None and out["arrivals"] == 8 and out["offered_rps"] == pytest.approx(0.8)
    assert str(out["line"]).startswith("Offered 0.8 sessions/s of the nominal 1.0 (8 arrivals in 10.0 s)")
