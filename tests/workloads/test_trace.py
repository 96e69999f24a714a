"""Trace replay: arrival gaps and lengths survive loading, scaling and clipping."""

from __future__ import annotations

import csv
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from itlbench.errors import ConfigError
from itlbench.workloads import LoadSpec, build_load_plan, load_trace, replay

REAL_CSV = (Path(__file__).resolve().parents[2].parent
            / "shared/data/azure-llm-trace-2023/AzureLLMInferenceTrace_conv.csv")

ROWS = [
    ("2023-11-16 18:15:46.6805900", 374, 44),
    ("2023-11-16 18:15:50.9951690", 396, 109),
    ("2023-11-16 18:15:51.2224670", 879, 55),
    ("2023-11-16 18:15:51.3910170", 9000, 16),
    ("2023-11-16 18:16:01.0000000", 100, 5000),
    ("2023-11-16 18:16:03.5000000", 12, 7),
]


def _seconds(stamp: str) -> Decimal:
    """Independent parse keeping all fractional digits."""
    whole, frac = stamp.split(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return Decimal(int(base)) + Decimal("0." + frac)


def _expected_offsets(stamps: list[str]) -> np.ndarray:
    first = _seconds(stamps[0])
    return np.array([float(_seconds(s) - first) for s in stamps])


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(ROWS)
    return path


def test_small_trace_keeps_gaps_and_lengths(small_csv: Path) -> None:
    trace = load_trace(small_csv)
    np.testing.assert_allclose(trace.offsets_s, _expected_offsets([r[0] for r in ROWS]), atol=1e-9)
    assert trace.prompt_tokens.tolist() == [r[1] for r in ROWS]
    assert trace.output_tokens.tolist() == [r[2] for r in ROWS]


def test_offset_and_limit_rebase_time(small_csv: Path) -> None:
    trace = load_trace(small_csv, offset=2, limit=3)
    assert trace.prompt_tokens.tolist() == [879, 9000, 100]
    assert trace.offsets_s[0] == 0.0
    np.testing.assert_allclose(trace.offsets_s, _expected_offsets([r[0] for r in ROWS[2:5]]), atol=1e-9)


@pytest.mark.parametrize("scale", [2.0, 4.0, 0.5])
def test_time_scale_divides_gaps_exactly(small_csv: Path, scale: float) -> None:
    trace = load_trace(small_csv)
    rep = replay(trace, max_model_len=100_000, time_scale=scale)
    assert np.array_equal(np.diff(rep.send_at_s), np.diff(trace.offsets_s) / scale)
    assert rep.clipped_rows == 0


def test_clipping_counts_rows(small_csv: Path) -> None:
    rep = replay(load_trace(small_csv), max_model_len=4096)
    assert rep.clipped_rows == 2  # 9000-token prompt; 5000-token output
    assert np.all(rep.prompt_tokens + rep.output_tokens <= 4096)
    assert rep.output_tokens[4] == 4095 and rep.prompt_tokens[4] == 1
    assert rep.prompt_tokens[3] == 4096 - 16


def test_missing_file_and_wrong_columns(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no trace file") as err:
        load_trace(tmp_path / "nope.csv")
    assert err.value.field == "--trace"
    bad = tmp_path / "bad.csv"
    bad.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(ConfigError, match="lacks column"):
        load_trace(bad)
    garbage = tmp_path / "garbage.csv"
    garbage.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,a,b\n")
    with pytest.raises(ConfigError, match="bad value") as err:
        load_trace(garbage)
    # polars' message carries hints on further lines; the error stays one line, with its fix at the end
    assert "\n" not in str(err.value) and str(err.value).endswith("integer token counts)")


def test_bad_scale_and_limit(small_csv: Path) -> None:
    with pytest.raises(ConfigError) as err:
        replay(load_trace(small_csv), 4096, time_scale=0)
    assert err.value.field == "--time-scale"  # the flag `itlbench run` has
    with pytest.raises(ConfigError):
        load_trace(small_csv, limit=0)


def test_trace_plan_replays_in_order(small_csv: Path) -> None:
    spec = LoadSpec(workload="trace", trace_path=str(small_csv), trace_time_scale=2.0,
                    duration_s=7.0, max_model_len=4096, inject="1k@3s")
    plan = build_load_plan(spec)
    assert plan.streams == []
    sent = list(plan.open_loop)
    times = [p.send_at_s for p in sent]
    assert times == sorted(times)
    replayed = [p for p in sent if not p.injected]
    offsets = _expected_offsets([r[0] for r in ROWS]) / 2.0
    np.testing.assert_allclose([p.send_at_s for p in replayed], offsets[offsets < 7.0], atol=1e-9)
    assert [p.prompt_tokens for p in replayed][:3] == [374, 396, 879]
    assert all(len(p.prompt_token_ids or ()) == p.prompt_tokens for p in replayed)
    assert plan.description["trace"]["clipped_rows"] == 2


def test_trace_needs_a_path_and_no_rate() -> None:
    with pytest.raises(ConfigError, match="needs a CSV"):
        build_load_plan(LoadSpec(workload="trace"))
    with pytest.raises(ConfigError) as err:
        build_load_plan(LoadSpec(workload="trace", trace_path="x.csv", rate=3.0))
    assert err.value.field == "--rate"


@pytest.mark.skipif(not REAL_CSV.is_file(), reason=f"shared Azure trace not present at {REAL_CSV}")
def test_real_azure_trace_first_1000_rows() -> None:
    with REAL_CSV.open() as fh:
        rows = list(csv.reader(fh))[1:1001]
    trace = load_trace(REAL_CSV, limit=1000)
    assert len(trace) == 1000
    np.testing.assert_allclose(trace.offsets_s, _expected_offsets([r[0] for r in rows]), atol=1e-6)
    assert trace.prompt_tokens.tolist() == [int(r[1]) for r in rows]
    assert trace.output_tokens.tolist() == [int(r[2]) for r in rows]
    rep = replay(trace, max_model_len=1_000_000, time_scale=2.0)
    assert np.array_equal(np.diff(rep.send_at_s), np.diff(trace.offsets_s) / 2.0)
    assert rep.prompt_tokens.tolist() == trace.prompt_tokens.tolist()
    clipped = replay(trace, max_model_len=2048)
    too_long = np.sum(trace.prompt_tokens + np.minimum(trace.output_tokens, 2047) > 2048)
    assert clipped.clipped_rows == too_long > 0


def _burst(tmp_path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    + "".join(f"{t},m,{p},{o},0,Conversation log\n" for t, p, o in rows))
    return path


def test_unusable_and_shortened_rows_are_warned_with_counts(tmp_path: Path) -> None:
    path = _burst(tmp_path, [("0", "100", "10"), ("1", "-5", "10"), ("2", "0", "10"), ("3", "50", ""),
                             ("4", "500000", "10")])
    plan = build_load_plan(LoadSpec(workload="trace", trace_path=str(path), max_model_len=8192, duration_s=8.0))
    assert plan.description["warnings"] == [
        "--trace: 3 of 5 rows skipped: a missing, zero or negative token count",
        "--trace: 1 of 2 rows shortened to fit max_model_len 8192 (prompt + output)"]
    assert [r.prompt_tokens for r in plan.open_loop] == [100, 8182]
    assert plan.description["trace"]["invalid_rows"] == 3


def test_a_trace_with_no_usable_row_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="none of the 2 rows") as err:
        load_trace(_burst(tmp_path, [("0", "0", "10"), ("1", "5", "")]))
    assert err.value.field == "--trace"


def test_a_header_only_trace_names_no_offset_flag(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    assert "below its header" in str(err.value) and "offset" not in str(err.value)


def test_rows_after_the_duration_are_counted_with_the_flags_that_replay_them(tmp_path: Path) -> None:
    # was: a 3500 s trace under --duration 120 sent its first 456 rows and said nothing of the other 18,910
    rows = [(str(t), "10", "5") for t in (0, 10, 20, 60, 95.5)]
    spec = LoadSpec(workload="trace", trace_path=str(_burst(tmp_path, rows)), duration_s=25.0, trace_time_scale=2.0)
    plan = build_load_plan(spec)
    assert len([p for p in plan.open_loop]) == 3  # 0, 5, 10 s; 30 s and 47.75 s are past 25 s
    assert plan.description["warnings"] == [
        "--trace: 2 of 5 rows not sent: they arrive after --duration 25 s (the trace spans 47.75 s at "
        "--time-scale 2); to replay it all, use --duration 48s or --time-scale 3.83"]
    assert 95.5 / 3.83 < 25.0
    whole = build_load_plan(LoadSpec(workload="trace", trace_path=spec.trace_path, duration_s=48.0,
                                     trace_time_scale=2.0))
    assert len(list(whole.open_loop)) == 5 and whole.description["warnings"] == []


def test_a_run_that_outlasts_its_trace_says_the_window_goes_idle(tmp_path: Path) -> None:
    plan = build_load_plan(LoadSpec(workload="trace", duration_s=60.0,
                                    trace_path=str(_burst(tmp_path, [("0", "10", "5"), ("4.5", "10", "5")]))))
    assert plan.description["warnings"] == [
        "--trace: its last row is sent at 4.5 s of the 60 s run, so the rest of the window has no trace load "
        "(--duration 5s ends with it)"]


@pytest.mark.parametrize(("last", "scale", "spans", "time_scale"), [
    ("1e300", 1.0, "1e+300 s", "2.01e+299"),
    ("40", 1e-300, "4e+301 s", "8.01"),
])
def test_a_trace_spanning_more_than_a_week_is_not_told_to_run_for_it(tmp_path: Path, last: str, scale: float,
                                                                       spans: str, time_scale: str) -> None:
    # was: "use --duration 1000000000000000052504760255204420248704468581108159154915854115111802457988908195786371
    # 375080447864043704443832883878176942523235360430575644792184786706982848387200926575803737830233794788090059368
    # 953234970799945081119038967640880074652742780142494579258788820056842838115467196834763571712s or ..."
    spec = LoadSpec(workload="trace", trace_path=str(_burst(tmp_path, [("0", "10", "5"), (last, "10", "5")])),
                    duration_s=5.0, trace_time_scale=scale)
    [warning] = build_load_plan(spec).description["warnings"]
    assert f"the trace spans {spans}" in warning and "--duration" not in warning.split("to replay it all")[1]
    assert warning.endswith(f"to replay it all, use --time-scale {time_scale}"), warning
    assert len(warning) < 200
