"""Chunks read together: a server that sent them at once keeps ITL valid; a client that read late does not."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.itl import gap_table, pooled, steady
from itlbench.analysis.read_together import classify_reads, tag_gaps
from itlbench.analysis.ttft import ttft_table
from itlbench.analysis.validity import check_validity
from itlbench.rundir.schema import frame

MS = 1_000_000
STREAMS = 4
STEPS = 120  # a step every 10 ms: 4 × 119 gaps support a p99


def _chunks(late: set[int], every: int = 10, k: int = 3) -> pl.DataFrame:
    """Every stream gets a token per step, read 50 µs after it arrived; for the streams in `late`, every
    `every`-th run of k tokens comes in one read stamped with the last one's arrival."""
    rows = []
    for s in range(STREAMS):
        for i in range(STEPS):
            arrival = (1000 + 10 * i) * MS + s * 20_000
            stamp = arrival
            if s in late and i % every < k and i // every > 0:
                stamp = (1000 + 10 * (i - i % every + k - 1)) * MS + s * 20_000
            rows.append({"request_id": f"r{s}", "index": i, "n_tokens": 1, "stamp": "kernel", "t_ns": stamp,
                         "t_read_ns": stamp + 50_000, "read_chunks": 1})
    out = frame("chunks", rows)
    return out.with_columns(pl.len().over("request_id", "t_ns").cast(pl.Int64).alias("read_chunks"))


def _requests() -> pl.DataFrame:
    return frame("requests", [{"request_id": f"r{s}", "server_request_id": f"s{s}", "cls": "chat", "injected": False,
                               "stream": s, "prompt_tokens": 100, "scheduled_ns": 900 * MS, "sent_ns": 900 * MS,
                               "first_token_ns": 1000 * MS, "status": "ok"} for s in range(STREAMS)])


def _pauses(late_runs: bool) -> pl.DataFrame:
    rows = [{"start_ns": (1000 + 10 * (10 * r)) * MS, "end_ns": (1000 + 10 * (10 * r + 2)) * MS + MS, "kind": "loop"}
            for r in range(1, STEPS // 10)] if late_runs else []
    return frame("client_pauses", rows)


def _verdict(chunks: pl.DataFrame, pauses: pl.DataFrame) -> dict[str, object]:
    reqs = _requests()
    gaps = tag_gaps(steady(gap_table(chunks, reqs)), chunks, reqs, pauses)
    samples = frame("client_samples", [{"t_ns": (1000 + 100 * j) * MS, "loop_lag_s": 0.0005, "cpu_percent": 10.0,
                                        "in_flight": STREAMS, "clock_offset_ns": 0} for j in range(12)])
    return check_validity(ttft_table(reqs, frame("steps", [])), samples, pooled(gaps), pauses=pauses, gaps=gaps)


def test_one_stream_held_while_others_were_read_is_the_server() -> None:
    chunks = _chunks(late={2})
    reads = classify_reads(chunks, _requests())
    assert reads.height == STEPS // 10 - 1 and set(reads["late_by"]) == {"server"}
    verdict = _verdict(chunks, _pauses(False))
    assert verdict["valid"], verdict["reasons"]
    assert verdict["figures"]["shared_read_by"]["server"] > 0  # type: ignore[index]
    assert verdict["figures"]["shared_read_by"]["client"] == 0  # type: ignore[index]


def test_every_stream_read_late_at_once_is_the_client() -> None:
    chunks = _chunks(late=set(range(STREAMS)))
    reads = classify_reads(chunks, _requests())
    assert set(reads["late_by"]) == {"client"}
    verdict = _verdict(chunks, _pauses(False))
    assert not verdict["valid"] and "itl_s" in verdict["affected"]
    assert any("the client read them late" in r for r in verdict["reasons"])  # type: ignore[union-attr]


def test_a_logged_client_pause_makes_it_the_client_even_if_others_were_read() -> None:
    chunks = _chunks(late={2})
    reads = classify_reads(chunks, _requests(), _pauses(True))
    assert set(reads["late_by"]) == {"client"}
    assert not _verdict(chunks, _pauses(True))["valid"]


def test_gaps_without_shared_reads_carry_no_late_by() -> None:
    chunks = _chunks(late=set())
    gaps = tag_gaps(gap_table(chunks, _requests()), chunks, _requests())
    assert gaps["late_by"].null_count() == gaps.height
    assert _verdict(chunks, _pauses(False))["valid"]


def test_a_stream_skipped_while_the_others_advance_is_a_preemption() -> None:
    """Client-only attribution: stream r3 gets nothing for 20 steps while the rest advance every step."""
    from itlbench.analysis.client_attribution import client_stalls
    from itlbench.analysis.stalls import StallParams

    chunks = _chunks(late=set()).filter(~((pl.col("request_id") == "r3") & pl.col("index").is_between(50, 69)))
    chunks = chunks.with_columns(pl.col("index").rank("ordinal").over("request_id").cast(pl.Int64).sub(1))
    reqs = _requests()
    report = client_stalls(steady(gap_table(chunks, reqs)), chunks, reqs, StallParams()).report
    stalls = report.stalls
    assert stalls.height == 1 and stalls["request_id"][0] == "r3"
    assert stalls["cause"][0] == "preemption" and stalls["unknown_reason"][0] == "skipped"  # the basis, stated
    assert stalls["skipped_steps"][0] >= 18
    assert report.summary["by_cause"] == {"preemption": {"count": 1, "stalled_s": stalls["gap_s"][0]}}
    assert report.summary["by_unknown_reason"] == {}
