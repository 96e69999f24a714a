"""SGLang's scheduler log beside the client-only attribution (`analyze --server-log`), honest about its
one-second stamps."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.analysis.sglang_log import parse_line, parse_log
from itlbench.cli import app
from itlbench.testing.openai_peer import serve_in_thread
from tests.support.traced_peer import TracedConfig, TracedPeer

runner = CliRunner()


def _local_ns(text: str, fmt: str = "%Y-%m-%d %H:%M:%S") -> int:
    return int(dt.datetime.strptime(text, fmt).timestamp() * 1e9)  # noqa: DTZ007 - as the log: local time


def test_prefill_and_decode_lines_of_several_versions_parse() -> None:
    pre = parse_line("[2025-01-23 19:35:28 TP0] Prefill batch. #new-seq: 2, #new-token: 8191, #cached-token: 64, "
                     "cache hit rate: 0.00%, token usage: 0.01, #running-req: 1, #queue-req: 7")
    assert pre is not None and pre["kind"] == "prefill" and pre["rank"] == "TP0"
    assert (pre["new_seq"], pre["new_tokens"], pre["cached_tokens"], pre["running"], pre["queued"]) == (2, 8191, 64, 1, 7)
    assert pre["t_ns"] == _local_ns("2025-01-23 19:35:28") and pre["resolution_s"] == 1.0
    dec = parse_line("sglang  | [2025-08-01 21:05:25 TP0 EP0] Decode batch. #running-req: 1, #token: 2266, "
                     "token usage: 0.00, cuda graph: True, gen throughput (token/s): 75.25, #queue-req: 0, "
                     "timestamp: 2025-08-01T21:05:25.498932")
    assert dec is not None and dec["kind"] == "decode" and dec["rank"] == "TP0 EP0"
    assert dec["gen_tokens_per_s"] == 75.25 and dec["kv_tokens"] == 2266 and dec["running"] == 1
    assert dec["resolution_s"] == 1e-6  # the appended ISO timestamp is used where present
    assert dec["t_ns"] == _local_ns("2025-08-01T21:05:25.498932", "%Y-%m-%dT%H:%M:%S.%f")
    assert parse_line("[2025-01-23 19:35:28] INFO:     127.0.0.1:47208 - \"GET /v1/models HTTP/1.1\" 200 OK") is None
    assert parse_log(["no batch here", "[2025-01-23 19:35:28] Prefill batch. #new-seq: 1, #new-token: 7"]).height == 1


def test_a_log_without_batch_lines_or_a_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    from tests.support.report_runs import build_run

    run_dir = build_run(tmp_path / "ext", external=True)
    (tmp_path / "empty.log").write_text("[2025-01-23 19:35:28] INFO: Application startup complete.\n")
    for log, says in ((tmp_path / "empty.log", "no `Prefill batch.`"), (tmp_path / "none.log", "not found")):
        res = runner.invoke(app, ["analyze", str(run_dir), "--server-log", str(log)], terminal_width=200)
        assert res.exit_code == 2 and "--server-log" in res.output and says in res.output, res.output



def test_a_hostile_log_line_is_read_past_not_a_traceback() -> None:
    """A count no int64 holds was a polars ComputeError, a stamp no calendar has (month 13) a ValueError; the
    counts are null (the line still says a batch ran), the line without a time is none."""
    log = parse_log(["[2025-01-23 19:35:28] Prefill batch. #new-seq: 1, #new-token: 99999999999999999999999, "
                     "#cached-token: -5, token usage: nan",
                     "[2025-13-45 19:35:28] Prefill batch. #new-seq: 1, #new-token: 7",
                     "[0000-01-01 00:00:00] Prefill batch. #new-seq: 1, #new-token: 7",
                     "[2025-01-23 19:35:29] Decode batch. #running-req: 1, timestamp: 2025-99-01T00:00:00.5"])
    assert log["kind"].to_list() == ["prefill", "decode"]
    assert log["new_tokens"].to_list() == [None, None] and log["cached_tokens"].to_list() == [None, None]
    assert log["token_usage"].to_list() == [None, None] and log["new_seq"].to_list() == [1, None]
    assert log["t_ns"][1] == _local_ns("2025-01-23 19:35:29") and log["resolution_s"][1] == 1.0


@pytest.mark.e2e
def test_the_logged_prefill_batches_carry_the_injected_prompt_the_client_named(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    cfg = TracedConfig(sglang_log=str(log), prefill_s_per_token=5e-5, tick_s=0.01)
    out = tmp_path / "run"
    # fixed-shape streams start together and stay in step: with 40-token requests (0.4 s) an injection
    # could land while all four were between requests, its stall then in their TTFT, not in any gap. The
    # peer's ticks are at least 10 ms, so 250 tokens keep every first request streaming past the injection
    # (at 1.5 s after a 0.5 s warmup, 2.0 s: at most 200 ticks), however loaded the machine.
    with serve_in_thread(cfg, peer_cls=TracedPeer) as (_, url):
        res = runner.invoke(app, ["run", "--endpoint", url, "--model", "peer", "--workload", "fixed:64:250",
                                  "--streams", "4", "--duration", "3", "--warmup", "0.5", "--inject", "8k@1.5s",
                                  "--no-live", "--no-report", "--out", str(out)], terminal_width=200)
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["analyze", str(out), "--server-log", str(log)], terminal_width=200)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "server-log.json").read_text())
    assert doc["source"] == "sglang_log" and doc["resolution_s"] == 1.0
    assert doc["prefill_batches_in_run"] >= 5 and doc["decode_lines_in_run"] > 0  # 4 streams' and the injection's
    injected = [e for e in doc["events"] if (e["named_prefill_tokens"] or 0) >= 8000]
    assert injected, doc["events"]
    top = max(injected, key=lambda e: e["named_prefill_tokens"])
    assert top["log_agrees"] and top["new_tokens"] >= 8192 and top["cause"] == "prefill", top
    assert "SGLang log:" in " ".join(res.output.split())
    # the same run beside a log that never scheduled the injected prompt: the log disagrees
    (tmp_path / "without.log").write_text("".join(x for x in log.read_text().splitlines(keepends=True)
                                                  if "#new-token: 8192," not in x))
    res = runner.invoke(app, ["analyze", str(out), "--server-log", str(tmp_path / "without.log")], terminal_width=200)
    assert res.exit_code == 0, res.output
    again = json.loads((out / "server-log.json").read_text())
    top = max((e for e in again["events"] if (e["named_prefill_tokens"] or 0) >= 8000),
              key=lambda e: e["named_prefill_tokens"])
    assert top["log_agrees"] is False and again["disagree"] >= 1, top


def test_a_server_log_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    """It said "not found" of a directory that is there."""
    from itlbench.analysis.sglang_log import read_log
    from itlbench.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^--server-log: {re.escape(str(tmp_path))} is a directory"):
        read_log(tmp_path)
