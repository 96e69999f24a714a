"""Analysis on a hand-built run (tests/analysis/hand_built_run.py): buckets, window, TTFT, ITL, goodput,
validity and the summary; its stalls are in test_analysis_stalls.py."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from itlbench.analysis import RunWindow, SloSet, parse_slo, summarize
from itlbench.analysis.buckets import BUCKET_LABELS, bucket_for, bucket_of
from itlbench.analysis.goodput import judge
from itlbench.analysis.itl import bundling, gap_table, per_token, pooled, steady, tpot, tpot_table
from itlbench.analysis.ttft import ttft_by_bucket, ttft_by_class, ttft_table
from itlbench.analysis.validity import check_validity
from itlbench.analysis.window import select_window
from itlbench.rundir.schema import frame
from tests.analysis.hand_built_run import INJ, MS, R0, R1, R2, WINDOW, _chunks, _req, _step, hand_built_tables


@pytest.fixture
def tables() -> dict[str, pl.DataFrame]:
    return hand_built_tables()


def _gaps_s(*streams: list[int]) -> np.ndarray:
    return np.concatenate([np.diff(np.array(s, dtype=np.int64) * MS) / 1e9 for s in streams])


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q, method="linear"))


# buckets ------------------------------------------------------------------------------------------


def test_bucket_bounds():
    cases = {
        1: "le128",
        128: "le128",
        129: "le512",
        512: "le512",
        513: "le2k",
        2048: "le2k",
        2049: "le8k",
        8192: "le8k",
        8193: "le32k",
        32768: "le32k",
        32769: "gt32k",
    }
    df = pl.DataFrame({"n": list(cases)}).with_columns(b=bucket_of(pl.col("n")))
    assert df["b"].to_list() == list(cases.values())
    assert [bucket_for(n) for n in cases] == list(cases.values())
    assert BUCKET_LABELS == ("le128", "le512", "le2k", "le8k", "le32k", "gt32k")
    assert pl.DataFrame({"n": [None]}, schema={"n": pl.Int64}).select(bucket_of(pl.col("n"))).item() is None


# window -------------------------------------------------------------------------------------------


def test_window_drops_warmup(tables):
    t = select_window(tables, WINDOW)
    assert "w0" not in t["requests"]["request_id"].to_list()
    assert "w0" not in t["chunks"]["request_id"].to_list()
    assert t["steps"].height == 6
    assert t["server_metrics"].height == 0 and t["client_samples"].height == 0


# TTFT ---------------------------------------------------------------------------------------------


def test_ttft_decomposition(tables):
    t = select_window(tables, WINDOW)
    rows = {r["request_id"]: r for r in ttft_table(t["requests"], t["steps"]).iter_rows(named=True)}
    r0 = rows["r0"]
    assert r0["bucket"] == "le128"
    assert r0["ttft_s"] == pytest.approx(0.030)
    assert r0["client_lag_s"] == pytest.approx(0.001)
    assert r0["queue_s"] == pytest.approx(0.004)  # step 1005 − sent 1001
    assert r0["prefill_s"] == pytest.approx(0.025)  # first token 1030 − step 1005
    assert r0["server_s"] == pytest.approx(0.029)
    inj = rows["inj"]
    assert inj["bucket"] == "le32k"
    assert inj["ttft_s"] == pytest.approx(0.5)
    assert inj["queue_s"] == pytest.approx(0.009)
    assert inj["prefill_s"] == pytest.approx(0.490)
    assert rows["r3"]["ttft_s"] is None and rows["r3"]["queue_s"] is None


def test_ttft_without_steps_has_no_queue_split(tables):
    t = select_window(tables, WINDOW)
    rows = ttft_table(t["requests"], t["steps"].clear())
    r0 = rows.filter(pl.col("request_id") == "r0").row(0, named=True)
    assert r0["ttft_s"] == pytest.approx(0.030)
    assert r0["queue_s"] is None and r0["prefill_s"] is None
    assert r0["server_s"] == pytest.approx(0.029)


def test_ttft_percentiles_by_bucket_and_class(tables):
    t = select_window(tables, WINDOW)
    table = ttft_table(t["requests"], t["steps"])
    by_bucket = ttft_by_bucket(table)
    assert list(by_bucket) == list(BUCKET_LABELS)
    # one request cannot support even a median: withheld beside its count, the max still stands
    assert by_bucket["le512"]["count"] == 1 and by_bucket["le512"]["p50"] is None
    assert by_bucket["le512"]["max"] == pytest.approx(0.030)
    assert by_bucket["gt32k"] == {
        "p50": None,
        "p90": None,
        "p99": None,
        "max": None,
        "mean": None,
        "count": 0,
    }
    by_class = ttft_by_class(table)
    chat = [0.030, 0.030, 0.025]
    assert by_class["chat"]["count"] == 3
    assert by_class["chat"]["p50"] == pytest.approx(_pct(chat, 50))
    assert by_class["chat"]["p90"] is None and by_class["chat"]["p99"] is None  # 3 < 10, 3 < 100
    assert by_class["chat"]["mean"] == pytest.approx(np.mean(chat))
    assert by_class["injected"]["max"] == pytest.approx(0.5)


# ITL ----------------------------------------------------------------------------------------------


def test_pooled_itl_steady_and_all(tables):
    t = select_window(tables, WINDOW)
    gaps = gap_table(t["chunks"], t["requests"])
    expected = _gaps_s(R0, R1, R2)
    assert len(expected) == 33
    got = pooled(steady(gaps))
    assert got["count"] == 33
    for key, q in [("p50", 50), ("p90", 90), ("p95", 95)]:  # 33 gaps support up to p95 (20)
        assert got[key] == pytest.approx(_pct(expected, q), rel=1e-12), key
    assert got["p99"] is None and got["p999"] is None  # would need 100 and 1,000 gaps
    assert got["max"] == pytest.approx(0.5)
    assert got["mean"] == pytest.approx(expected.mean())
    everything = np.concatenate([expected, _gaps_s(INJ)])
    all_view = pooled(gaps)
    assert all_view["count"] == 35
    assert all_view["p95"] == pytest.approx(_pct(everything, 95))


def test_per_token_splits_bundled_gap(tables):
    t = select_window(tables, WINDOW)
    gaps = steady(gap_table(t["chunks"], t["requests"]))
    base = list(_gaps_s(R0, R1, R2))
    base.remove(0.020)  # r2's second chunk carried 2 tokens: its 20 ms gap becomes 2 × 10 ms
    expected = np.array(base + [0.010, 0.010])
    got = per_token(gaps)
    assert got["count"] == 34
    assert got["p50"] == pytest.approx(_pct(expected, 50))
    assert got["p95"] == pytest.approx(_pct(expected, 95))
    assert got["mean"] == pytest.approx(expected.mean())


def test_tpot_per_request(tables):
    t = select_window(tables, WINDOW)
    table = tpot_table(t["chunks"], t["requests"])
    rows = dict(zip(table["request_id"], table["tpot_s"], strict=True))
    assert rows["r0"] == pytest.approx((1750 - 1030) / 1000 / 12)
    assert rows["r2"] == pytest.approx((1745 - 1045) / 1000 / 12)  # 12 chunks, 13 tokens
    steady_tpot = [rows["r0"], rows["r1"], rows["r2"]]
    got = tpot(table.filter(~pl.col("injected")))
    assert got["count"] == 3
    assert got["p50"] == pytest.approx(_pct(steady_tpot, 50))
    assert got["mean"] == pytest.approx(np.mean(steady_tpot))


def test_bundling_detection():
    few = frame("chunks", _chunks("a", list(range(100)), {5: 2}))
    b = bundling(few)
    assert b["fraction"] == pytest.approx(0.01) and b["bundled_chunks"] == 1 and b["warning"] is None
    many = frame("chunks", _chunks("a", list(range(10)), {i: 4 for i in range(5)}))
    b = bundling(many)
    assert b["fraction"] == pytest.approx(0.5)
    assert b["tokens_per_chunk"] == pytest.approx(2.5)
    assert "bundles" in b["warning"]


# goodput / validity / summary -------------------------------------------------------------------


def test_goodput_default_and_custom_slos(tables):
    s = summarize(tables, WINDOW)
    # each steady stream's own ITL p99 is over the default 200 ms; the injected one's (gaps 20, 20) is not
    own_p99 = {rid: _pct(np.diff(times) / 1e3, 99) for rid, times in (("r0", R0), ("r1", R1), ("r2", R2),
                                                                     ("inj", INJ))}
    t = select_window(tables, WINDOW)
    judged = judge(ttft_table(t["requests"], t["steps"]), gap_table(t["chunks"], t["requests"]), SloSet())
    got = dict(zip(judged["request_id"], judged["itl_p99_s"], strict=True))
    for rid, expected in own_p99.items():
        assert got[rid] == pytest.approx(expected)
    assert [rid for rid, p99 in own_p99.items() if p99 > 0.2] == ["r0", "r1", "r2"]
    assert s["goodput"]["good"] == 1 and s["goodput"]["total"] == 5
    misses = {(m["slo"], m["cls"]): m for m in s["goodput"]["misses"]}
    itl = misses[("itl_p99", "chat")]
    assert (itl["missed"], itl["of"], itl["target_s"]) == (3, 4, 0.2)
    assert itl["worst_s"] == pytest.approx(max(own_p99[r] for r in ("r0", "r1", "r2")))
    assert s["goodput"]["fraction"] == pytest.approx(0.2)
    assert s["goodput"]["requests_per_s"] == pytest.approx(0.1)
    s = summarize(tables, WINDOW, parse_slo("itl_max=600ms"))
    assert s["goodput"]["good"] == 4  # the error request is never good
    s = summarize(tables, WINDOW, parse_slo("itl_max=600ms,ttft:le128=20ms"))
    assert s["goodput"]["good"] == 3  # r0 (le128, 30 ms) misses
    s = summarize(tables, WINDOW, parse_slo("itl_max=600ms,injected/ttft:le32k=100ms"))
    assert s["goodput"]["good"] == 3


def _sent_late(tables, rid: str, lag_ms: int) -> pl.DataFrame:
    return tables["requests"].with_columns(
        pl.when(pl.col("request_id") == rid).then(pl.col("scheduled_ns") + lag_ms * MS)
        .otherwise(pl.col("sent_ns")).alias("sent_ns"))


def test_validity_flags(tables):
    s = summarize(tables, WINDOW)
    assert s["valid"] is True and s["validity"]["reasons"] == [] and s["validity"]["affected"] == []
    assert s["validity"]["standing"] == ["ttft_s", "itl_s", "stalls", "goodput", "throughput", "split"]
    lags = [0.001, 0.002, 0.0, 0.001]  # r0, r1, r2, inj: 4 requests cannot support a p99
    assert s["validity"]["figures"]["send_lag_p99_s"] is None
    assert s["validity"]["figures"]["send_lag_max_s"] == pytest.approx(max(lags))
    # r1 (le512, TTFT 30 ms) sent 10 ms late: a third of its TTFT
    samples = frame("client_samples", [{"t_ns": (1000 + 100 * i) * MS, "loop_lag_s": 0.001 if i else 0.5,
                                        "cpu_percent": 95.0} for i in range(10)])
    s = summarize({**tables, "requests": _sent_late(tables, "r1", 10), "client_samples": samples}, WINDOW)
    v = s["validity"]
    assert s["valid"] is False
    reasons = " | ".join(v["reasons"])
    assert "TTFT le512: 1 of 1 requests were sent late" in reasons
    # 10 loop-lag samples support a p90 (0.051 s) against the ITL p90 of 33 gaps: stamps are late
    itl_p90 = s["itl_s"]["p90"]
    assert v["figures"]["loop_lag_stat"] == "p90" and v["figures"]["loop_lag_vs_itl_s"] == pytest.approx(itl_p90)
    assert v["figures"]["loop_lag_s"] == pytest.approx(_pct([0.5] + [0.001] * 9, 90))
    assert "event-loop lag p90" in reasons and "CPU mean 95.0 %" in reasons
    assert {"ttft_s.le512", "ttft_by_class_s.chat", "itl_s", "goodput", "stalls"} <= set(v["affected"])
    assert v["standing"] == ["throughput", "split"]


def test_late_send_judged_against_the_ttft_it_distorts(tables):
    """13 ms late on a 500 ms TTFT (2.6 %) stands; 60 ms late (12 %) is named, and only its figures fall."""
    s = summarize({**tables, "requests": _sent_late(tables, "inj", 13)}, WINDOW)
    assert s["valid"] is True
    s = summarize({**tables, "requests": _sent_late(tables, "inj", 60)}, WINDOW)
    v = s["validity"]
    assert s["valid"] is False and v["affected"] == ["ttft_s.le32k", "ttft_by_class_s.injected", "goodput"]
    assert v["standing"] == ["itl_s", "stalls", "throughput", "split"]


def test_many_requests_tolerate_a_late_tail():
    """With 100+ requests, up to 1 % sent late leaves the TTFT figure standing; 2 % does not."""
    def table(late: int) -> pl.DataFrame:
        return pl.DataFrame({"request_id": [f"r{i}" for i in range(200)], "cls": ["chat"] * 200,
                             "bucket": ["le2k"] * 200, "ttft_s": [0.1] * 200,
                             "client_lag_s": [0.05] * late + [0.0] * (200 - late)})
    empty = frame("client_samples", [])
    assert check_validity(table(2), empty, {})["valid"] is True
    assert check_validity(table(4), empty, {})["affected"] == ["ttft_s.le2k", "ttft_by_class_s.chat", "goodput"]


def test_closed_loop_lag_is_judged_like_any_other(tables):
    s = summarize({**tables, "requests": _sent_late(tables, "r2", 900)}, WINDOW)
    assert s["valid"] is False and "ttft_s.le2k" in s["validity"]["affected"]


def test_gaps_are_windowed_by_arrival_not_by_schedule(tables):
    """A stream that began in warmup still contributes the gaps that end inside the window."""
    long_warm = _chunks("w0", [600, 610, 990, 1010, 1030, 1530])
    chunks = pl.concat([tables["chunks"].filter(pl.col("request_id") != "w0"), frame("chunks", long_warm)])
    base = summarize(tables, WINDOW)
    s = summarize({**tables, "chunks": chunks}, WINDOW)
    assert s["itl_s"]["count"] == base["itl_s"]["count"] + 3  # 990→1010, 1010→1030, 1030→1530
    assert s["itl_s"]["max"] == pytest.approx(0.5)
    assert s["requests"]["total"] == base["requests"]["total"]  # still scheduled in warmup


def test_summary_keys_and_json(tables):
    s = summarize(tables, WINDOW)
    json.dumps(s, allow_nan=False)
    assert s["requests"] == {"total": 5, "ok": 4, "error": 1, "timeout": 0, "cancelled": 0, "injected": 1,
                             "outside_window": 1, "outside_window_failed": 0, "in_flight_at_start": 0,
                             "in_flight_at_start_failed": 0}
    assert s["ttft_s"]["all"]["count"] == 4
    assert s["ttft_s"]["le2k"]["count"] == 1 and s["ttft_s"]["le2k"]["max"] == pytest.approx(0.025)
    # one le128 request cannot support a median of its parts (ttft_table has them per request)
    assert s["ttft_breakdown_s"]["le128"] == dict.fromkeys(
        ("client_lag_p50", "queue_p50", "prefill_p50", "server_p50", "queue_p99"))
    assert s["itl_s"]["count"] == 33 and s["itl_all_s"]["count"] == 35
    assert s["itl_s"]["max"] == pytest.approx(0.5)
    assert s["stalls"]["count"] == 3 and s["stalls"]["victims"] == 3
    assert s["split"]["source"] == "engine_steps"
    assert s["split"]["prefill_s"] == pytest.approx(0.005 + 0.010 + 0.010 + 0.490)
    assert s["split"]["decode_s"] == pytest.approx(0.010)
    out_tokens = len(R0) + len(R1) + len(R2) + 1 + len(INJ)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(out_tokens / 10)
    assert s["throughput"]["requests_per_s"] == pytest.approx(0.4)
    assert s["throughput"]["input_tokens_per_s"] == pytest.approx((100 + 400 + 1000 + 32768) / 10)
    assert s["bundling"]["fraction"] == pytest.approx(1 / 39) and s["bundling"]["warning"] is None
    for key in ("ttft", "itl", "stall", "split", "prompt_buckets", "goodput", "validity", "percentiles"):
        assert s["definitions"][key]
    assert set(s) >= {
        "ttft_s",
        "ttft_breakdown_s",
        "itl_s",
        "itl_per_token_s",
        "tpot_s",
        "stalls",
        "split",
        "throughput",
        "goodput",
        "requests",
        "bundling",
        "valid",
        "validity",
        "definitions",
    }


def test_empty_tables_do_not_crash():
    s = summarize({}, WINDOW)
    json.dumps(s, allow_nan=False)
    assert s["itl_s"]["count"] == 0 and s["itl_s"]["p99"] is None
    assert s["stalls"]["count"] == 0 and s["split"]["source"] == "unavailable"
    assert s["goodput"]["fraction"] is None and s["valid"] is True
    s = summarize({}, RunWindow(0, 5, 5))  # zero-length window
    json.dumps(s, allow_nan=False)
    assert s["throughput"]["requests_per_s"] is None and s["goodput"]["requests_per_s"] is None


def test_the_crosscheck_sees_the_steps_of_a_window_request_gap_that_ends_after_the_window() -> None:
    """A request of the window can stall past its end (the drain): the engine steps there are the ones
    to check its worst gap against, not the window's (which would call the whole gap 'not engine time')."""
    times = [1010, 1020, 2500]
    tables = {
        "requests": frame("requests", [_req("a", "sa", "chat", 100, 1000, 1000, times),
                                       _req("b", "sb", "injected", 16000, 1500, 1500, [2500, 2510])]),
        "chunks": frame("chunks", _chunks("a", times) + _chunks("b", [2500, 2510])),
        "steps": frame("steps", [_step(0, 1005, 1010, prefill=100, ids=["sa"]), _step(1, 1015, 1020, decode=1),
                                 _step(2, 1500, 1900, prefill=8000, ids=["sb"]),
                                 _step(3, 2100, 2500, prefill=8000, decode=1, ids=["sb"])]),
    }
    check = summarize(tables, RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=2000 * MS))[
        "crosscheck"]["engine"]
    assert check["worst_client_gap_s"] == pytest.approx(1.48)
    assert check["worst_gap_steps"] == 2 and check["worst_gap_engine_busy_s"] == pytest.approx(0.8)
    assert check["worst_gap_unexplained_s"] == pytest.approx(0.68)
    # the injected prompt's prefill ran on past the window too: both its steps, 1.0 s from first to last
    (injected,) = check["injected"]
    assert injected["prefill_steps"] == 2 and injected["engine_prefill_span_s"] == pytest.approx(1.0)


def test_a_window_request_prefilled_after_the_window_keeps_its_ttft_parts() -> None:
    """A request sent late in the window may queue behind a long prefill and be prefilled after the window
    closes: its queue and prefill are read off every step, not the window's (else the report's TTFT
    breakdown drew the median as all client lag)."""
    tables = {
        "requests": frame("requests", [_req("a", "sa", "chat", 100, 1900, 1900, [2500, 2510]),
                                       _req("b", "sb", "chat", 100, 1950, 1950, [2600, 2610])]),
        "chunks": frame("chunks", _chunks("a", [2500, 2510]) + _chunks("b", [2600, 2610])),
        "steps": frame("steps", [_step(0, 2400, 2500, prefill=100, ids=["sa"]),
                                 _step(1, 2500, 2600, prefill=100, ids=["sb"])]),
    }
    parts = summarize(tables, RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=2000 * MS))[
        "ttft_breakdown_s"]["le128"]
    assert parts["queue_p50"] == pytest.approx(0.525) and parts["prefill_p50"] == pytest.approx(0.1)
