"""One rule for an event's cause in every attribution source (event_cause.py): by cause, then reason."""

from __future__ import annotations

import polars as pl

from itlbench.analysis import client_attribution, otel_attribution
from itlbench.analysis.event_cause import event_causes


def _stalls(rows: list[tuple[int, str, str | None, float]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"event": pl.Int64, "cause": pl.Utf8, "unknown_reason": pl.Utf8,
                                      "gap_s": pl.Float64}, orient="row")


def _events(causes: list[str | None]) -> pl.DataFrame:
    return pl.DataFrame({"event": list(range(len(causes))), "cause": causes}, schema={"event": pl.Int64,
                                                                                      "cause": pl.Utf8})


def _cause(events: pl.DataFrame, stalls: pl.DataFrame) -> list[tuple[str | None, str | None]]:
    out = event_causes(events, stalls).sort("event")
    return list(zip(out["cause"].to_list(), out["unknown_reason"].to_list(), strict=True))


def test_unexplained_seconds_win_however_finely_their_reasons_are_split() -> None:
    # the sixth vLLM run's shape: a client pause under a long unexplained gap. The client-only source splits
    # the unexplained seconds into two reasons, the spans have one: both must say unknown
    client_only = _stalls([(0, "client", None, 1.0), (0, "unknown", "silent", 0.7), (0, "unknown", "late_read", 0.5)])
    spans = _stalls([(0, "client", None, 1.0), (0, "unknown", "no_steps", 1.2)])
    assert _cause(_events(["engine"]), client_only) == [("unknown", "silent")]
    assert _cause(_events([None]), spans) == [("unknown", "no_steps")]


def test_a_known_cause_with_the_larger_share_wins() -> None:
    stalls = _stalls([(0, "client", None, 1.3), (0, "unknown", "silent", 0.7), (0, "unknown", "late_read", 0.5),
                      (1, "preemption", "skipped", 0.4), (1, "unknown", "silent", 0.3)])
    assert _cause(_events([None, "outside_engine"]), stalls) == [("client", None), ("preemption", "skipped")]


def test_an_events_own_vouched_cause_stays() -> None:
    stalls = _stalls([(0, "unknown", "no_steps", 5.0), (0, "prefill", None, 0.1)])
    assert _cause(_events(["prefill"]), stalls) == [("prefill", None)]


def test_a_tie_is_decided_by_name_not_by_row_order() -> None:
    rows = [(0, "unknown", "silent", 0.5), (0, "client", None, 0.5)]
    assert _cause(_events([None]), _stalls(rows)) == _cause(_events([None]), _stalls(rows[::-1])) == [("client", None)]


def test_both_sources_use_the_one_rule() -> None:
    assert client_attribution.event_causes is otel_attribution.event_causes is event_causes
