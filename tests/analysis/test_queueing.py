"""What held the requests that waited for the engine: each waiting step charged to one limit, by its duration,
read from real runs of the simulated engine and from hand-built step logs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl

from itlbench.analysis.queueing import max_num_seqs_of, queueing_summary, step_limits
from itlbench.core.engine_config import EngineConfig
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.report.queueing import queueing_sentence

MS = 1_000_000


def _steps(*rows: tuple[int, int, int, int, int, float, int, int, int | None]) -> pl.DataFrame:
    """(duration ms, waiting, running, finished, preemptions, kv_usage, prefill, decode, budget) per step."""
    cols = ("dur", "num_waiting", "num_running", "num_finished", "num_preemptions", "kv_usage", "prefill_tokens",
            "decode_tokens", "token_budget")
    df = pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], schema_overrides={"token_budget": pl.Int64})
    start = pl.col("dur").cum_sum().shift(1, fill_value=0) * MS
    return df.with_columns(start.alias("start_ns"), (start + pl.col("dur") * MS).alias("end_ns")).drop("dur")


def test_each_waiting_step_is_charged_to_the_first_limit_that_held_it_for_its_duration() -> None:
    steps = _steps((10, 2, 63, 1, 0, 0.5, 0, 64, 2048),   # batch at its cap of 64 when scheduled (one finished)
                   (20, 1, 10, 0, 1, 0.9, 100, 10, 2048),  # a preemption: K/V
                   (30, 1, 10, 0, 0, 0.99, 0, 10, 2048),   # blocks all but full: K/V
                   (40, 3, 10, 0, 0, 0.5, 2038, 10, 2048),  # a long prompt's chunk spent the budget
                   (50, 1, 10, 0, 0, 0.5, 20, 10, 2048),   # none of these: it arrived during the step
                   (60, 0, 64, 0, 0, 0.5, 0, 64, 2048))    # nothing waited: not charged
    assert step_limits(steps, 64)["limit"].to_list() == ["max_num_seqs", "kv_cache", "kv_cache", "token_budget", "other"]
    ttft = pl.DataFrame({"ttft_s": [0.1, 0.2, None], "queue_s": [0.01, 0.05, 3.0]})
    q = queueing_summary(steps, ttft, 1.0, 64)
    assert q is not None and q["by_limit_s"] == {"max_num_seqs": 0.01, "kv_cache": 0.05, "token_budget": 0.04,
                                                  "other": 0.05}
    assert abs(q["waiting_s"] - 0.15) < 1e-12 and q["main_limit"] == "kv_cache"
    assert q["queue_s"]["max"] == 0.05 and q["queue_s"]["count"] == 2  # a request with no first token is not counted
    # an unknown cap (a server that did not say) never blames the batch; unchunked (no budget) never the budget
    unknown = step_limits(steps, None)["limit"].to_list()
    assert unknown[0] == "other" and step_limits(steps.with_columns(pl.lit(None, pl.Int64).alias("token_budget")),
                                                 64)["limit"].to_list()[3] == "other"


def test_without_an_engine_step_log_there_is_no_queueing_figure() -> None:
    assert queueing_summary(pl.DataFrame(), pl.DataFrame({"ttft_s": [0.1], "queue_s": [None]}), 1.0, 64) is None
    assert max_num_seqs_of({"engine": {"name": "vllm"}}) is None
    assert max_num_seqs_of({"engine": {"itlbench": {"engine": {"max_num_seqs": 8}}}}) == 8  # itlbench serve's


def test_the_sentence_names_the_main_limit_first_with_its_share_and_the_queue_tail() -> None:
    summary = {"queueing": {"max_num_seqs": 64, "waiting_s": 10.0, "waiting_share": 0.17, "queue_s": {"p99": 3.03},
                            "by_limit_s": {"max_num_seqs": 7.5, "kv_cache": 0.0, "token_budget": 2.5, "other": 0.0}}}
    assert queueing_sentence(summary) == (
        "Requests waited for the engine in 17% of the window (queue p99 3.03 s): the running batch was full "
        "(max_num_seqs 64) 75% of that time; each step's token budget was spent (by prefill chunks or decodes) 25%.")
    summary["queueing"]["waiting_s"] = 0.0
    assert queueing_sentence(summary) is None and queueing_sentence({"queueing": None}) is None


def test_a_simulated_engine_with_a_small_batch_cap_says_its_queue_was_held_by_the_cap(tmp_path: Path) -> None:
    """Eight closed-loop streams on an engine that runs two at a time: six always wait, for the batch."""
    engine = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192, max_num_seqs=2)
    _, summary = run_load_test(RunConfig(workload="fixed:256:16", streams=8, duration_s=2.0, warmup_s=0.2, live=False,
                                         out=tmp_path / "run", engine=engine, seed=5))
    q = summary["queueing"]
    assert q["max_num_seqs"] == 2 and q["main_limit"] == "max_num_seqs"
    assert q["by_limit_s"]["max_num_seqs"] / q["waiting_s"] > 0.9 and q["waiting_share"] > 0.8
    _, wide = run_load_test(RunConfig(workload="fixed:256:16", streams=8, duration_s=2.0, warmup_s=0.2, live=False,
                                      out=tmp_path / "wide", engine=replace(engine, max_num_seqs=64), seed=5))
    assert wide["queueing"]["by_limit_s"]["max_num_seqs"] == 0.0
    assert wide["queueing"]["queue_s"]["p50"] < q["queue_s"]["p50"] / 5


def test_the_ttft_breakdown_keeps_the_queues_tail_the_median_hides() -> None:
    """95 requests queue 15 ms and 5 queue 3 s behind a full batch: the median queue says 15 ms while TTFT's
    p99 is 3 s; queue_p99 says where that p99 went (and a bucket too small for a p99 withholds it)."""
    from itlbench.analysis.ttft import breakdown_by_bucket

    queue = [0.015] * 95 + [3.0] * 5
    table = pl.DataFrame({"bucket": ["le512"] * 100 + ["le2k"] * 3, "queue_s": queue + [0.01] * 3,
                          "prefill_s": [0.04] * 103, "client_lag_s": [0.0] * 103})
    table = table.with_columns((pl.col("queue_s") + pl.col("prefill_s")).alias("server_s"),
                               (pl.col("queue_s") + pl.col("prefill_s")).alias("ttft_s"))
    parts = breakdown_by_bucket(table)
    assert parts["le512"]["queue_p50"] == 0.015 and parts["le512"]["queue_p99"] == 3.0
    assert parts["le2k"]["queue_p99"] is None and parts["le2k"]["queue_p50"] == 0.01
