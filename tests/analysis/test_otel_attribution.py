"""Stall attribution from vLLM-style `llm_request` spans, on the hand-built external run (tests/support):
an 8k prompt sent at 5.001 s whose prefill silences every stream over [5.0, 6.5] s, first token at 6.51 s."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.analysis.otel_attribution import (
    SPANS_FILE,
    analyze_run_otel,
    match_requests,
    otel_stalls,
    prefill_windows,
    read_spans,
    write_spans,
)
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import _window_from
from itlbench.analysis.wall_clock import WallClockMap
from itlbench.cli.app import app
from itlbench.rundir import load_tables
from tests.support.report_runs import MS, S, build_run

OFFSET = 1_700_000_000 * S  # the spans' wall clock minus the run clock


def _span(rid: str, sent_ns: int, first_ns: int, prefill_s: float, prompt: int, offset: int = OFFSET) -> dict:
    return {"name": "llm_request", "kind": "SERVER", "start_ns": sent_ns + 300_000 + offset, "end_ns": 0,
            "attributes": {"gen_ai.request.id": rid, "gen_ai.usage.prompt_tokens": prompt,
                           "gen_ai.latency.time_to_first_token": (first_ns - sent_ns - 300_000) / S,
                           "gen_ai.latency.time_in_model_prefill": prefill_s,
                           "gen_ai.latency.time_in_queue": 0.001}}


def _spans(with_injected: bool = True, offset: int = OFFSET) -> list[dict]:
    streams = [_span(f"cmpl-s{i}", 1101 * MS, 1200 * MS + i * MS, 0.05, 500, offset) for i in range(4)]
    inj = [_span("cmpl-inj-0", 5001 * MS, 6510 * MS, 1.49, 8192, offset)] if with_injected else []
    return [*streams, *inj, {"name": "other", "start_ns": 0, "attributes": {}}]


def _run(tmp_path: Path) -> Path:
    return build_run(tmp_path / "ext", external=True)


def _stalls(run_dir: Path, spans: list[dict]) -> dict:
    meta = json.loads((run_dir / "run.json").read_text())
    tables = load_tables(run_dir)
    tables["client_samples"] = tables["client_samples"].with_columns(pl.lit(OFFSET).alias("clock_offset_ns"))
    return otel_stalls(tables, _window_from(meta), spans, StallParams.from_meta(meta))


def test_prefill_windows_end_at_the_first_token_in_the_run_clock() -> None:
    w = prefill_windows(_spans(), WallClockMap.fixed(OFFSET))
    assert w.height == 5  # the span that is not an llm_request is skipped
    inj = w.filter(pl.col("span_id") == "cmpl-inj-0").row(0, named=True)
    assert inj["end_ns"] == 6510 * MS and inj["start_ns"] == 6510 * MS - 1490 * MS
    assert inj["arrival_ns"] == 5001 * MS + 300_000


def test_spans_match_the_client_request_of_the_same_length_sent_nearest() -> None:
    requests = pl.DataFrame({"request_id": ["a", "b", "c"], "server_request_id": [None, None, None],
                             "sent_ns": [1 * S, 2 * S, 2 * S + 5 * MS], "prompt_tokens": [100, 100, 900]},
                            schema_overrides={"server_request_id": pl.Utf8})
    spans = [_span("x", 2 * S, 3 * S, 0.5, 100, 0), _span("y", 2 * S + 5 * MS, 3 * S, 0.5, 900, 0),
             _span("z", 9 * S, 10 * S, 0.5, 100, 0)]  # z: no request sent within the tolerance
    m = match_requests(prefill_windows(spans, WallClockMap.fixed(0)), requests)
    assert dict(zip(m["span_id"], m["request_id"], strict=True)) == {"x": "b", "y": "c"}
    assert m["arrival_minus_sent_ms"].to_list() == [pytest.approx(0.3), pytest.approx(0.3)]


def test_the_injected_prefill_is_named_from_the_spans(tmp_path: Path) -> None:
    stalls = _stalls(_run(tmp_path), _spans())
    assert stalls["attribution_source"] == "vllm_otel"
    assert stalls["count"] == 4
    assert stalls["by_cause"] == {"prefill": {"count": 4, "stalled_s": pytest.approx(stalls["stalled_s"])}}
    top = stalls["attribution"][0]
    assert top["cause"] == "prefill" and top["injected_request_ids"] == ["inj-000"]
    assert stalls["spans"]["matched"] == 5 and stalls["spans"]["arrival_minus_sent_ms_max"] == pytest.approx(0.3)
    (inj,) = stalls["injected_prefills"]
    assert inj["request_id"] == "inj-000" and inj["prefill_s"] == pytest.approx(1.49)


def test_spans_are_mapped_through_the_offset_of_their_moment_when_the_wall_clock_steps(tmp_path: Path) -> None:
    """The wall clock stepped 2 s forward at 3.2 s: the streams' spans (1.1 s) carry the old offset, the
    injected one (5.0 s) the new. One offset for the run (the samples' median, the new one) would put the
    streams' spans 2 s before their sends; each span's own moment's offset puts all five within 0.3 ms."""
    run_dir = _run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    tables = load_tables(run_dir)
    step_ns = 3200 * MS
    tables["client_samples"] = tables["client_samples"].with_columns(
        (OFFSET + (pl.col("t_ns") > step_ns).cast(pl.Int64) * 2 * S).alias("clock_offset_ns"))
    spans = [sp if sp.get("start_ns", 0) < OFFSET + step_ns else {**sp, "start_ns": sp["start_ns"] + 2 * S}
             for sp in _spans()]
    stalls = otel_stalls(tables, _window_from(meta), spans, StallParams.from_meta(meta))
    assert stalls["spans"]["matched"] == 5 and stalls["spans"]["clock_drift_ms"] == pytest.approx(2000)
    assert stalls["spans"]["arrival_minus_sent_ms_max"] == pytest.approx(0.3)
    assert stalls["attribution"][0]["injected_request_ids"] == ["inj-000"]
    assert stalls["spans"]["clock_offset_ns"] == OFFSET + 2 * S  # the median: 15 of the 20 samples


def test_a_stall_no_span_explains_stays_unknown(tmp_path: Path) -> None:
    stalls = _stalls(_run(tmp_path), _spans(with_injected=False))
    assert set(stalls["by_cause"]) == {"unknown"}
    top = stalls["attribution"][0]
    assert top["cause"] == "unknown" and top["prefill_request_ids"] == [] and top["injected_request_ids"] == []


def test_analyze_attribution_otel_writes_summary_otel(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    # the hand-built run records no clock offset: its spans are stamped in the run clock
    assert write_spans(run_dir / SPANS_FILE, _spans(offset=0)) == 6
    assert len(read_spans(run_dir / SPANS_FILE)) == 6
    res = CliRunner().invoke(app, ["analyze", str(run_dir), "--attribution", "otel"])
    assert res.exit_code == 0, res.output
    doc = json.loads((run_dir / "summary-otel.json").read_text())
    assert doc["stalls"]["attribution_source"] == "vllm_otel" and doc["attribution"]["source"] == "vllm_otel"
    assert doc["stalls"]["attribution"][0]["injected_request_ids"] == ["inj-000"]
    assert analyze_run_otel(run_dir)["stalls"]["count"] == doc["stalls"]["count"]
    missing = CliRunner().invoke(app, ["analyze", str(build_run(tmp_path / "bare", external=True)),
                                       "--attribution", "otel"])
    assert missing.exit_code == 2 and SPANS_FILE in missing.output
    torn = run_dir / "torn.jsonl"  # a file cut mid-line, or not spans at all
    torn.write_text((run_dir / SPANS_FILE).read_text()[:-40] + "\n")
    broken = CliRunner().invoke(app, ["analyze", str(run_dir), "--attribution", "otel", "--spans", str(torn)],
                                terminal_width=300)
    assert broken.exit_code == 2 and f"error: --spans: {torn} line 6 is not a JSON object" in broken.output


def test_a_runs_spans_leave_out_those_before_it_started(tmp_path: Path) -> None:
    from itlbench.analysis.otel_attribution import spans_for_run

    run_dir = _run(tmp_path)  # run clock: start 0, end 11 s; no offset recorded
    spans = [_span("probe", -5 * MS, -4 * MS, 0.001, 8, 0), *_spans(offset=0), _span("late", 30 * S, 31 * S, 0.1, 9, 0)]
    kept = [s["attributes"].get("gen_ai.request.id") for s in spans_for_run(run_dir, spans)]
    assert "probe" not in kept and "late" not in kept and "cmpl-inj-0" in kept


def test_a_span_whose_timings_are_not_numbers_is_skipped_not_a_traceback(tmp_path: Path) -> None:
    """The spans come from the server: text, NaN, a number no int64 holds or attributes that are not an object
    were ValueError/OverflowError/AttributeError tracebacks out of `analyze --attribution otel`."""
    good = _span("cmpl-inj-0", 5001 * MS, 6510 * MS, 1.49, 8192)
    ttft, prefill = "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_model_prefill"
    hostile = [good | {"attributes": "x"}, good | {"start_ns": "soon"}, good | {"start_ns": 10**30},
               good | {"attributes": good["attributes"] | {ttft: "fast"}},
               good | {"attributes": good["attributes"] | {ttft: float("nan")}},
               good | {"attributes": good["attributes"] | {prefill: 1e308}},
               good | {"attributes": good["attributes"] | {prefill: True}}]
    kept = good | {"attributes": good["attributes"] | {"gen_ai.usage.prompt_tokens": "8k",
                                                       "gen_ai.latency.time_in_queue": float("inf")}}
    w = prefill_windows([*hostile, kept], WallClockMap.fixed(OFFSET))
    assert w.height == 1 and w["prompt_tokens"].to_list() == [0] and w["queue_s"].to_list() == [0.0]
    run = _run(tmp_path)
    write_spans(run / SPANS_FILE, [*hostile, *_spans()])
    result = CliRunner().invoke(app, ["analyze", str(run), "--attribution", "otel"], terminal_width=300)
    assert result.exit_code == 0, result.output
    assert json.loads((run / "summary-otel.json").read_text())["stalls"]["spans"]["received"] == len(hostile) + 6


def test_spans_that_are_a_directory_are_named_as_one(tmp_path: Path) -> None:
    """It said "not found" of a directory that is there."""
    from itlbench.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^--spans: {re.escape(str(tmp_path))} is a directory"):
        analyze_run_otel(_run(tmp_path), tmp_path)


def test_a_span_line_nested_deeper_than_the_parser_goes_is_named(tmp_path: Path) -> None:
    """json's decoder raised RecursionError on it: a traceback, not the line's number."""
    from itlbench.errors import ConfigError

    path = tmp_path / SPANS_FILE
    path.write_text("{}\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="line 2 is not a JSON object"):
        read_spans(path)
