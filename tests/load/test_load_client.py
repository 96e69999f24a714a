"""The streaming client: timestamps against the server's own send log, token counting, errors."""

from __future__ import annotations

import asyncio
import time

import polars as pl
import pytest

from itlbench.load.clients.sse import CHUNK_ROWS_PER_HANDOFF, StreamClient, build_body
from itlbench.load.target import Target
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan, RequestPlan
from tests.support.load import closed, plans, run, table


def test_chunk_times_match_server_send_log(tmp_path):
    with serve_in_thread(PacedConfig(tick_s=0.02, first_delay_s=0.03)) as (srv, url):
        res = run(closed(2, 20), url, tmp_path, duration_s=1.5)
        sends = {sid: list(ts) for sid, ts in srv.log.items()}
    assert res.counts["ok"] >= 2
    req = table(tmp_path, "requests").filter(pl.col("status") == "ok")
    ch = table(tmp_path, "chunks").join(req.select("request_id", "server_request_id"), on="request_id")
    offsets, gap_errors = [], []
    for (_, sid), g in ch.sort("index").group_by(["request_id", "server_request_id"]):
        client = g["t_ns"].to_list()
        server = sends[sid]
        assert len(client) == len(server) == 20
        offsets += [c - s for c, s in zip(client, server, strict=True)]
        gap_errors += [(c1 - c0) - (s1 - s0) for c0, c1, s0, s1 in zip(client, client[1:], server, server[1:], strict=False)]
    offsets.sort()
    assert offsets[0] >= 0  # never before the server sent it
    assert offsets[len(offsets) // 2] < 2e6 and offsets[-1] < 10e6
    assert max(abs(e) for e in gap_errors) < 10e6


def test_role_finish_and_usage_chunks_carry_no_tokens(tmp_path):
    cfg = PacedConfig(tick_s=0.005, role_chunk=True, usage=True)
    with serve_in_thread(cfg) as (_, url):
        run(LoadPlan(streams=[plans("c", 12, count=2)]), url, tmp_path, duration_s=1.0, target_kw={"api": "chat"})
    req = table(tmp_path, "requests")
    assert req["status"].to_list() == ["ok", "ok"]
    assert req["output_tokens"].to_list() == [12, 12]
    assert req["num_chunks"].to_list() == [12, 12]
    assert req["output_tokens_reported"].to_list() == [12, 12]
    assert req["prompt_tokens_reported"].to_list() == [7, 7]
    assert req["finish_reason"].to_list() == ["length", "length"]
    assert req["server_request_id"].null_count() == 0


@pytest.mark.parametrize("max_tokens,expected_chunks", [(10, [2] * 5), (7, [2, 2, 2, 1])])
def test_token_ids_count_bundled_tokens(tmp_path, max_tokens, expected_chunks):
    with serve_in_thread(PacedConfig(tick_s=0.005, token_ids=True, tokens_per_chunk=2)) as (_, url):
        run(LoadPlan(streams=[plans("b", max_tokens, count=1)]), url, tmp_path, duration_s=0.5)
    req = table(tmp_path, "requests").row(0, named=True)
    assert req["output_tokens"] == max_tokens and req["num_chunks"] == len(expected_chunks)
    assert table(tmp_path, "chunks").sort("index")["n_tokens"].to_list() == expected_chunks


def test_non_200_is_recorded_with_status(tmp_path):
    with serve_in_thread(PacedConfig(status=500)) as (_, url):  # not 503: that one backs the stream off (backoff.py)
        res = run(LoadPlan(streams=[plans("e", 5, count=3)]), url, tmp_path, duration_s=0.5)
    req = table(tmp_path, "requests")
    assert res.counts["error"] == 3 and res.aborted_reason is None
    assert req["http_status"].to_list() == [500] * 3
    assert all("paced server set to fail" in e for e in req["error"].to_list())


def test_request_timeout_is_recorded(tmp_path):
    with serve_in_thread(PacedConfig(tick_s=0.02)) as (_, url):
        run(LoadPlan(streams=[plans("t", 100, count=1)]), url, tmp_path, duration_s=0.3,
            target_kw={"timeout_s": 0.25})
    req = table(tmp_path, "requests").row(0, named=True)
    assert req["status"] == "timeout" and 5 <= req["num_chunks"] < 100
    assert table(tmp_path, "chunks").height == req["num_chunks"]


def test_body_uses_ids_only_where_accepted():
    p = RequestPlan("r", "w", "w", 3, 8, prompt_token_ids=(5, 6, 7), prompt_text="x y z")
    ids = build_body(p, Target("http://h/v1", "m"))
    assert ids["prompt"] == [5, 6, 7] and ids["ignore_eos"] is True and ids["min_tokens"] == 8
    assert ids["stream_options"] == {"include_usage": True} and ids["temperature"] == 0
    text = build_body(p, Target("http://h/v1", "m", accepts_token_ids=False, forced_lengths=False))
    assert text["prompt"] == "x y z" and "ignore_eos" not in text
    chat = build_body(p, Target("http://h/v1", "m", api="chat"))
    assert chat["messages"] == [{"role": "user", "content": "x y z"}] and "prompt" not in chat


def test_long_stream_hands_chunks_over_while_it_runs():
    """A long request's chunk rows reach the sink in batches before it ends, indices continuous."""
    rows: list[dict] = []

    class Sink:
        def add(self, table: str, row: dict) -> None:
            if table == "chunks":
                rows.append(row)

    async def main(url: str) -> int:
        plan = RequestPlan("long", "chat", "chat", 4, 5000, prompt_token_ids=(1, 2, 3, 4))
        async with StreamClient(Target(url, "paced"), Sink()) as client:
            task = asyncio.create_task(client.run(plan, time.perf_counter_ns()))
            while len(rows) < CHUNK_ROWS_PER_HANDOFF and not task.done():
                await asyncio.sleep(0.01)
            in_flight = not task.done()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return in_flight

    with serve_in_thread(PacedConfig(tick_s=0.002)) as (_, url):
        assert asyncio.run(main(url)), "rows arrived only after the request ended"
    assert [r["index"] for r in rows] == list(range(len(rows)))  # the cancelled tail follows the batch
    assert len(rows) >= CHUNK_ROWS_PER_HANDOFF
