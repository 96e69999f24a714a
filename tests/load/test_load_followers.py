"""Steps follower and metrics sampler against the paced peer."""

from __future__ import annotations

import asyncio
import json

from itlbench.load.observers.metrics_sampler import MetricsSampler, metrics_url
from itlbench.load.observers.steps_follower import StepsFollower
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from tests.support.load import table


class Rows:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = {}

    def add(self, table: str, row: dict) -> None:
        self.rows.setdefault(table, []).append(row)


def test_steps_follower_reads_ndjson_and_resumes_after_reconnect(tmp_path):
    async def main(url: str) -> StepsFollower:
        store = RunStore(tmp_path)
        follower = StepsFollower(url, store, retry_s=0.05)
        task = asyncio.create_task(follower.run())
        async with asyncio.timeout(60):  # until it has resumed twice and read 20 steps
            while follower.reconnects < 2 or follower.rows < 20:
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
        return follower

    with serve_in_thread(PacedConfig(tick_s=0.01, steps_per_connection=7)) as (_, url):
        follower = asyncio.run(main(url))
    steps = table(tmp_path, "steps").sort("step")
    assert follower.reconnects >= 2 and steps.height == follower.rows >= 20
    assert steps["step"].to_list() == list(range(steps.height))  # no gap, no duplicate
    assert set(steps["phase"].to_list()) <= {"idle", "decode"} and steps["end_ns"].min() > 0


def test_metrics_sampler_keeps_engine_series_only():
    async def main(url: str) -> tuple[MetricsSampler, Rows]:
        rows = Rows()
        async with MetricsSampler(url, rows) as sampler:
            assert await sampler.scrape("baseline")
            assert not rows.rows  # nothing is parsed or written while the load may run
            sampler.finish()
        return sampler, rows

    with serve_in_thread(PacedConfig()) as (_, url):
        sampler, rows = asyncio.run(main(url))
    (scrape,) = rows.rows["scrapes"]
    assert scrape["reason"] == "baseline" and scrape["status"] == "ok" and scrape["end_ns"] > scrape["start_ns"]
    assert scrape["series"] == len(rows.rows["server_metrics"]) and scrape["bytes"] > 0
    assert {r["t_ns"] for r in rows.rows["server_metrics"]} == {scrape["start_ns"]}
    names = {r["name"] for r in rows.rows["server_metrics"]}
    assert sampler.prefix == "itlbench_" and "process_open_fds" not in names
    assert {"itlbench_num_requests_running", "itlbench_time_to_first_token_seconds_bucket",
            "itlbench_time_to_first_token_seconds_sum", "itlbench_time_to_first_token_seconds_count"} <= names
    gauge = next(r for r in rows.rows["server_metrics"] if r["name"] == "itlbench_num_requests_running")
    assert json.loads(gauge["labels"]) == {"model_name": "paced"} and gauge["value"] == 0.0
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
