"""Live telemetry against real peers, on one short real run of the bundled engine.

Debian's Prometheus, started here on loopback with the compose file's scrape config pointed at the
test's ports, scrapes `itlbench serve` and `itlbench run --metrics-port` while a long prompt is
injected among steady streams; then every query of every dashboard panel, with its variables
substituted, must return finite data through Prometheus' HTTP API. The same run exports over OTLP/HTTP
to an in-process receiver: client and server spans of a request share one trace, carry the GenAI
attribute names, and the histograms carry the conventions' recommended bucket boundaries.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from itlbench.harness.bundled_server import free_port
from itlbench.telemetry.otlp_receiver import OtlpReceiver
from tests.support.dashboards import ROOT, dashboards, substitute, targets

pytestmark = pytest.mark.e2e

SCRAPE = "1s"
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval: four scrape intervals
INJECT_TOKENS = 4096
BUDGET = 2048

# The GenAI metric conventions' recommended ExplicitBucketBoundaries, written out independently.
RECOMMENDED = {
    "gen_ai.client.operation.duration": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                         20.48, 40.96, 81.92],
    "gen_ai.client.token.usage": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                                  16777216, 67108864],
    "gen_ai.server.request.duration": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                       20.48, 40.96, 81.92],
    "gen_ai.server.time_to_first_token": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0],
    "gen_ai.server.time_per_output_token": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                            1.0, 2.5],
}


@dataclass
class Live:
    prom: str
    start: float
    end: float
    run_dir: Path
    spans: list[dict[str, Any]]
    points: list[dict[str, Any]]

    def get(self, path: str, **params: Any) -> Any:
        url = f"{self.prom}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query_range", query=expr, start=self.start, end=self.end, step=1)["result"]

    def last(self, expr: str) -> float:
        """The expression's value at the end of the run (0 when empty)."""
        result = self.get("/api/v1/query", query=expr, time=self.end)["result"]
        return max((float(s["value"][1]) for s in result), default=0.0)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"{what} not ready within {timeout_s:.0f} s")


def _wait_scraping(prom_url: str, proc: subprocess.Popen[bytes], jobs: set[str], timeout_s: float) -> None:
    """Until Prometheus has tried every job's target once. Its discovery hands new targets to the
    scrape loops a few seconds after start-up; a run begun before that has no zero sample before its
    injection, and `increase()` (the Injections annotation) has nothing to compare the first one with."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prometheus exited with {proc.returncode}"
        with urllib.request.urlopen(f"{prom_url}/api/v1/targets", timeout=5) as r:
            active = json.loads(r.read())["data"]["activeTargets"]
        tried = {t["labels"]["job"] for t in active if not t["lastScrape"].startswith("0001-")}
        if jobs <= tried:
            return
        time.sleep(0.2)
    raise AssertionError(f"prometheus had not scraped {sorted(jobs)} within {timeout_s:.0f} s")


def _prometheus_config(server_port: int, metrics_port: int) -> dict[str, Any]:
    """The compose file's Prometheus config, its targets moved to the test's loopback ports."""
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = SCRAPE
    ports = {"itlbench-engine": server_port, "itlbench-client": metrics_port}
    jobs = [j for j in config["scrape_configs"] if j["job_name"] in ports]
    assert len(jobs) == 2
    for job in jobs:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    config["scrape_configs"] = jobs
    return config


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: apt-get install -y --no-install-recommends prometheus (.ci/run does)"
    tmp = tmp_path_factory.mktemp("live")
    server_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(_prometheus_config(server_port, metrics_port)))
    rx = OtlpReceiver().start()
    prom = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "itlbench", "serve", "--model", "cpu-small", "--chunk-budget", str(BUDGET),
         "--kv-memory-gib", "0.5", "--max-num-seqs", "16", "--port", str(server_port), "--otlp-endpoint", rx.endpoint],
        stdout=open(tmp / "server.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        prom_url = f"http://127.0.0.1:{prom_port}"
        _wait_ready(f"{prom_url}/-/ready", prom, "prometheus", 60)
        _wait_ready(f"http://127.0.0.1:{server_port}/health", server, "itlbench serve", 300)
        _wait_scraping(prom_url, prom, {"itlbench-engine", "itlbench-client"}, 60)
        start = time.time()
        # a 4 s window: the 4k prompt sent at 1 s is answered ~1.3 s later, and ~1.7 s of 1 s scrapes follow it
        run = subprocess.run(
            [sys.executable, "-m", "itlbench", "run", "--endpoint", f"http://127.0.0.1:{server_port}/v1",
             "--model", "cpu-small", "--workload", "chat-short", "--streams", "4", "--inject", f"{INJECT_TOKENS}@1s",
             "--duration", "4", "--warmup", "1", "--seed", "1", "--no-live", "--no-report", "--out", str(tmp / "run"),
             "--metrics-port", f"127.0.0.1:{metrics_port}", "--otlp-endpoint", rx.endpoint],
            capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        server.send_signal(signal.SIGTERM)  # the server exports its last spans as it shuts down
        assert server.wait(60) == 0
        end = time.time()
        spans, points = rx.received.snapshot()
        yield Live(prom_url, start - 2, end + 1, tmp / "run", spans, points)
    finally:
        for proc in (server, prom):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        rx.stop()


def _has_finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(v)) for s in series for _, v in s["values"])


def test_every_dashboard_query_returns_data(live: Live) -> None:
    empty = []
    checked = 0
    for name, board in dashboards().items():
        for where, t in targets(board):
            expr = substitute(t["expr"], "itlbench_", RATE_INTERVAL)
            series = live.series(expr)
            checked += 1
            if not series or not _has_finite(series):
                empty.append(f"{name} {where}: {expr}")
    assert checked >= 40
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_dashboard_variable_has_values(live: Live) -> None:
    for name, board in dashboards().items():
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert m, var["query"]
            values = live.get(f"/api/v1/label/{m.group(2)}/values", start=live.start, end=live.end,
                              **{"match[]": substitute(m.group(1))})
            assert values, f"{name}: variable {var['name']} has no values"


def test_live_stalls_are_counted_with_their_cause(live: Live) -> None:
    """The injected prompt's prefill steps stall the steady streams; the live counter names prefill,
    as the post-run analysis does."""
    window = f"[{int(live.end - live.start) + 5}s]"
    assert live.last(f'max_over_time(itlbench_client_stalls_total{{cause="prefill"}}{window})') >= 1
    summary = json.loads((live.run_dir / "summary.json").read_text())
    assert summary["stalls"]["by_cause"].get("prefill", {}).get("count", 0) >= 1, summary["stalls"]
    ttft = ('max_over_time(itlbench_client_time_to_first_token_seconds_count'
            f'{{injected="true", prompt_bucket="le8k"}}{window})')
    assert live.last(ttft) == 1, "the one injected 4k prompt lands in the le8k bucket"
    info = live.series("itlbench_client_run_info")
    assert info and info[0]["metric"]["chunk_budget"] == str(BUDGET) and info[0]["metric"]["engine"] == "itlbench"
    assert info[0]["metric"]["run_id"] == live.run_dir.name


def test_the_run_s_final_client_values_reach_prometheus(live: Live) -> None:
    """The client's /metrics stays up after the run until Prometheus has scraped its final values: the
    requests counted equal the records, and none is left in flight."""
    requests = pl.read_parquet(live.run_dir / "requests/*.parquet")
    window = f"[{int(live.end - live.start) + 5}s]"
    assert live.last(f"sum(last_over_time(itlbench_client_requests_total{window}))") == requests.height
    assert live.last(f"sum(last_over_time(itlbench_client_requests_in_flight{window}))") == 0
    assert live.last(f"sum(last_over_time(itlbench_client_requests_sent_total{window}))") == requests.height


def test_every_latency_series_exists_from_the_client_s_first_scrape(live: Live) -> None:
    """A series born at its first request (a prompt bucket's first, the first injection) is first scraped above
    0, and rate() never counts that request: it went missing from the TTFT and latency panels. Every label set
    the plan sends is served, at zero, from the first scrape on."""
    first: dict[str, float] = {}
    for name in ("time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
                 "inter_token_latency_seconds_count"):
        series = live.series(f"itlbench_client_{name}")
        assert series, name
        first |= {json.dumps(s["metric"], sort_keys=True): float(s["values"][0][0]) for s in series}
    assert any('"injected": "true"' in k for k in first) and any('"prompt_bucket": "gt32k"' in k for k in first)
    born_late = {k: t - min(first.values()) for k, t in first.items() if t > min(first.values())}
    assert not born_late, f"series born after the first scrape (seconds later): {born_late}"


def test_the_stalls_panel_counts_whole_stalls(live: Live) -> None:
    (panel,) = [p for b in dashboards().values() for p in b["panels"] if p["title"].startswith("Stalled gaps by cause")]
    series = live.series(substitute(panel["targets"][0]["expr"], "itlbench_", RATE_INTERVAL))
    values = [float(v) for s in series for _, v in s["values"]]
    assert values and max(values) >= 1 and all(v == int(v) for v in values), values


def test_the_engine_and_run_table_keeps_a_finished_run(live: Live) -> None:
    """Read after the run (client and server gone), the table still names the engine's configuration and the
    run: its instant queries look over the dashboard's range, not only at its end."""
    (panel,) = [p for b in dashboards().values() for p in b["panels"] if p["title"] == "Engine and run"]
    window = f"{int(live.end - live.start) + 5}s"
    engine, runs = (live.get("/api/v1/query", query=substitute(t["expr"], range_=window), time=live.end)["result"]
                    for t in panel["targets"])
    assert [e["metric"]["chunk_budget"] for e in engine] == [str(BUDGET)], engine
    assert [r["metric"]["run_id"] for r in runs] == [live.run_dir.name], runs


def _pairs(live: Live) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    servers = {s["parent_span_id"]: s for s in live.spans if s["kind"] == "SERVER"}
    clients = [s for s in live.spans if s["kind"] == "CLIENT"]
    return [(c, servers.get(c["span_id"])) for c in clients]  # type: ignore[misc]


def test_client_and_server_spans_of_a_request_share_one_trace(live: Live) -> None:
    requests = pl.read_parquet(live.run_dir / "requests/*.parquet")
    pairs = _pairs(live)
    assert len(pairs) == requests.height, "one CLIENT span per request"
    for client, server in pairs:
        assert client["name"] == "text_completion cpu-small" and client["service"] == "itlbench-client"
        assert server is not None, f"no SERVER span continues {client['attributes']['itlbench.request.id']}"
        assert server["trace_id"] == client["trace_id"] and server["name"] == client["name"]
        assert server["service"] == "itlbench-server"
        ca, sa = client["attributes"], server["attributes"]
        assert ca["gen_ai.response.id"] == sa["gen_ai.response.id"]
        assert ca["gen_ai.usage.output_tokens"] == sa["gen_ai.usage.output_tokens"]


def test_spans_carry_the_genai_attributes_and_the_engine_steps(live: Live) -> None:
    requests = pl.read_parquet(live.run_dir / "requests/*.parquet")
    steps = pl.read_parquet(live.run_dir / "steps/*.parquet")
    by_id = {r["request_id"]: r for r in requests.to_dicts()}
    injected = 0
    for client, server in _pairs(live):
        ca, sa = client["attributes"], server["attributes"]
        for key in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                    "gen_ai.request.max_tokens", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                    "gen_ai.response.time_to_first_chunk", "gen_ai.response.finish_reasons", "server.address"):
            assert key in ca, key
        assert ca["gen_ai.operation.name"] == "text_completion" and ca["gen_ai.provider.name"] == "itlbench"
        row = by_id[ca["itlbench.request.id"]]
        assert ca["gen_ai.usage.output_tokens"] == row["output_tokens"]
        assert ca["gen_ai.response.time_to_first_chunk"] == pytest.approx(
            (row["first_token_ns"] - row["sent_ns"]) / 1e9, abs=2e-3)
        for key in ("itlbench.request.queue_time", "itlbench.request.prefill_time",
                    "itlbench.request.decode_time"):
            assert sa[key] >= 0, key
        mine = steps.filter(pl.col("prefill_request_ids").list.contains(row["server_request_id"]))
        assert sa["itlbench.engine.prefill_steps"] == mine["step"].sort().to_list()
        assert sa["itlbench.engine.steps"] >= len(mine) and sa["itlbench.engine.step.first"] == mine["step"].min()
        if ca["itlbench.injected"]:
            injected += 1
            assert len(mine) >= INJECT_TOKENS // BUDGET, "a 4k prompt at budget 2048 is prefilled in chunks"
    assert injected == 1


def test_genai_metrics_arrive_with_the_recommended_buckets(live: Live) -> None:
    for name, bounds in RECOMMENDED.items():
        points = [p for p in live.points if p["name"] == name]
        assert points, f"{name} never arrived"
        for p in points:
            assert p["type"] == "histogram" and p["bounds"] == pytest.approx(bounds), name
            assert p["attributes"]["gen_ai.operation.name"] == "text_completion"
            assert p["attributes"]["gen_ai.provider.name"] == "itlbench"
        assert sum(p["count"] for p in points) >= 1
    usage = {p["attributes"]["gen_ai.token.type"] for p in live.points if p["name"] == "gen_ai.client.token.usage"}
    assert usage == {"input", "output"}
