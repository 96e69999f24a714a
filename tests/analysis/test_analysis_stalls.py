"""Stalls on the hand-built run (tests/analysis/hand_built_run.py) and on small streams of their own:
detection, events, their causes and attribution."""

from __future__ import annotations

import polars as pl
import pytest

from itlbench.analysis.itl import gap_table, steady
from itlbench.analysis.stalls import StallParams, analyze_stalls, event_records, find_stalls
from itlbench.analysis.ttft import ttft_table
from itlbench.analysis.validity import check_validity
from itlbench.analysis.window import select_window
from itlbench.rundir.schema import frame
from tests.analysis.hand_built_run import MS, WINDOW, _chunks, _step, hand_built_tables


@pytest.fixture
def tables() -> dict[str, pl.DataFrame]:
    return hand_built_tables()


def test_stalls_and_attribution(tables):
    t = select_window(tables, WINDOW)
    gaps = steady(gap_table(t["chunks"], t["requests"]))
    report = analyze_stalls(gaps, t["steps"], t["requests"], StallParams(), WINDOW.measure_start_ns)
    s = report.summary
    assert s["count"] == 3
    assert s["stalled_s"] == pytest.approx(1.5)
    assert s["worst_s"] == pytest.approx(0.5)
    assert s["victims"] == 3
    assert s["events"] == 1
    assert s["attribution_source"] == "engine_steps"
    assert report.stalls["injected_request_ids"].to_list() == [["inj"]] * 3
    r0 = report.stalls.filter(pl.col("request_id") == "r0").row(0, named=True)
    assert r0["threshold_s"] == pytest.approx(0.1)  # 5 × 20 ms median
    assert r0["prefill_s"] == pytest.approx(0.490)  # step 1210–1700 inside gap 1210–1710
    assert r0["prefill_tokens"] == 32768
    (event,) = s["attribution"]
    assert event["victims"] == 3 and event["stalls"] == 3
    assert event["start_s"] == pytest.approx(0.200) and event["span_s"] == pytest.approx(0.510)
    assert event["injected_prefill"] is True
    assert event["prefill_request_ids"] == ["inj"] and event["prefill_tokens"] == 32768
    assert event["cause"] == "prefill" and s["by_cause"]["prefill"]["count"] == 3


def _cause_of_gap(steps: list[dict]) -> str:
    """One stream pacing 10 ms with a 300 ms gap (100 → 400 ms), over the given steps."""
    times = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 400, 410, 420]
    chunks = frame("chunks", _chunks("a", times))
    reqs = frame("requests", [{"request_id": "a", "server_request_id": "sa", "injected": False}])
    report = analyze_stalls(gap_table(chunks, reqs), frame("steps", steps), reqs, StallParams())
    (event,) = report.summary["attribution"]
    return event["cause"]


def test_stall_cause_read_off_the_overlapping_steps():
    decodes = [_step(i, 10 * i, 10 * i + 10, decode=1) for i in range(43)]
    assert _cause_of_gap(decodes) == "outside_engine"  # the engine kept stepping every 10 ms
    long_decode = [*decodes[:10], _step(10, 100, 390, decode=40), *decodes[39:]]
    assert _cause_of_gap(long_decode) == "engine"
    preempted = [{**d, "num_preemptions": 1} if d["step"] == 20 else d for d in decodes]
    assert _cause_of_gap(preempted) == "preemption"
    prefill = [*decodes[:10], _step(10, 100, 390, prefill=4000, ids=["other"]), *decodes[39:]]
    assert _cause_of_gap(prefill) == "prefill"


def test_client_pause_makes_a_stall_the_clients_and_flags_the_run():
    decodes = [_step(i, 10 * i, 10 * i + 10, decode=1) for i in range(43)]
    times = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 400, 410, 420]
    chunks = frame("chunks", _chunks("a", times))
    reqs = frame("requests", [{"request_id": "a", "server_request_id": "sa", "injected": False}])
    pauses = frame("client_pauses", [{"start_ns": 105 * MS, "end_ns": 395 * MS, "kind": "gc"}])
    report = analyze_stalls(gap_table(chunks, reqs), frame("steps", decodes), reqs, StallParams(), 0, pauses)
    (event,) = report.summary["attribution"]
    assert event["cause"] == "client" and event["client_pause_s"] == pytest.approx(0.29)
    assert report.summary["by_cause"] == {"client": {"count": 1, "stalled_s": pytest.approx(0.3)}}
    ttft = ttft_table(reqs, frame("steps", decodes))
    v = check_validity(ttft, frame("client_samples", []), {}, pauses=pauses, client_stalls=1)
    assert v["valid"] is False and "1 stall gaps are the client's own pauses" in v["reasons"][0]
    assert v["affected"] == ["stalls", "itl_s.max"] and "ttft_s" in v["standing"]
    short = frame("client_pauses", [{"start_ns": 105 * MS, "end_ns": 150 * MS, "kind": "loop"}])
    assert check_validity(ttft, frame("client_samples", []), {}, pauses=short)["valid"] is True


def test_stall_floor_and_factor():
    times = {"a": [0, 5, 10, 15, 55, 60], "b": [0, 100, 200, 300, 700, 800], "c": [1000, 1020, 1040, 1500]}
    chunks = frame("chunks", [c for rid, ts in times.items() for c in _chunks(rid, ts)])
    reqs = frame("requests", [{"request_id": r, "injected": False} for r in times])
    gaps = gap_table(chunks, reqs)
    stalls = find_stalls(gaps, StallParams(factor=4.0, floor_s=0.05))
    # a: 40 ms ≥ 4×5 ms but below the 50 ms floor; b: 400 ms ≥ 4×100 ms; c: 460 ms ≥ 4×20 ms.
    assert stalls["request_id"].to_list() == ["b", "c"]
    report = analyze_stalls(gaps, frame("steps", []), reqs, StallParams(factor=4.0, floor_s=0.05))
    assert report.summary["events"] == 2  # b's gap 300–700 ms and c's 1040–1500 ms do not overlap
    assert report.summary["attribution_source"] == "unavailable"
    assert report.summary["attribution"][0]["prefill_request_ids"] == []


def test_events_merge_transitively():
    times = {
        "a": [0, 10, 20, 520, 530, 540],
        "b": [0, 10, 400, 410, 420, 430],
        "c": [0, 10, 510, 520, 1020, 1030, 1040],
    }
    chunks = frame("chunks", [c for rid, ts in times.items() for c in _chunks(rid, ts)])
    reqs = frame("requests", [{"request_id": r, "injected": False} for r in times])
    report = analyze_stalls(
        gap_table(chunks, reqs), frame("steps", []), reqs, StallParams(factor=5, floor_s=0.05)
    )
    # a 20–520, b 10–400 and c 10–510 overlap; c's 520–1020 only touches a's end: a new event
    assert report.summary["count"] == 4
    assert report.events["stalls"].to_list() == [3, 1]
    assert report.events["victims"].to_list() == [3, 1]


def test_stall_events_are_listed_by_the_stream_seconds_they_stalled() -> None:
    """31 streams held 0.3 s by a mixed step come after 30 streams frozen 3.5 s by a long prefill."""
    def event(i: int, victims: int, worst: float) -> dict[str, object]:
        return {"event": i, "start_ns": i * 10**9, "end_ns": i * 10**9 + int(worst * 1e9), "stalls": victims,
                "victims": victims, "worst_s": worst, "stalled_s": victims * worst, "prefill_steps": 1,
                "prefill_tokens": 100, "prefill_s": worst, "injected_prefill": i == 2,
                "prefill_request_ids": [f"r{i}"], "injected_request_ids": ["inj"] if i == 2 else [],
                "longest_step_s": worst, "preemptions": 0, "client_pause_s": 0.0, "scrape_s": 0.0, "cause": "prefill"}

    events = pl.DataFrame([event(0, 31, 0.3), event(1, 31, 0.35), event(2, 30, 3.5), event(3, 2, 0.2)])
    top = event_records(events, 3, 0)
    assert [e["event"] for e in top] == [2, 1, 0] and top[0]["stalled_s"] == pytest.approx(105.0)
