"""`itlbench run --metrics-port`: the endpoint says where it is, and at the end it keeps serving until a
scraper has read the run's final values, bounded by the scrape interval it saw; no wait where nobody
scraped. The scraper here is a real HTTP client polling the real endpoint like Prometheus (every
0.2 s); test_telemetry_live.py checks the same against a real Prometheus."""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from itlbench.telemetry.metrics_server import MetricsServer
from itlbench.telemetry.observer import LiveTelemetry


class Scraper:
    """GETs the URL every `every_s` in a thread and keeps the last body it read, until the endpoint goes."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        self.url, self.every_s = url, every_s
        self.last = ""
        self.count = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    self.last = r.read().decode()
                    self.count += 1
            except (urllib.error.URLError, OSError):
                return  # the endpoint closed
            time.sleep(self.every_s)

    def value(self, sample: str) -> float:
        m = re.search(rf"^{re.escape(sample)} (\S+)$", self.last, re.M)
        assert m, f"{sample} not in the last scrape"
        return float(m.group(1))

    def join(self) -> None:
        self._thread.join(timeout=10)


def _request(tel: LiveTelemetry) -> Any:
    """One request through the observer's hooks, as the driver calls them."""
    ex = SimpleNamespace(plan=SimpleNamespace(workload="chat", injected=False, prompt_tokens=100),
                         scheduled_ns=time.perf_counter_ns(), times=[], status="ok", watch=None)
    tel.on_start(ex)
    return ex


IN_FLIGHT = 'itlbench_client_requests_in_flight{injected="false"}'
OK = 'itlbench_client_requests_total{injected="false",outcome="ok"}'


def test_the_final_values_reach_a_scraper_before_the_endpoint_closes(capsys: pytest.CaptureFixture[str]) -> None:
    tel = LiveTelemetry.start("127.0.0.1:0", None)
    assert tel is not None and tel.metrics_url is not None
    scraper = Scraper(tel.metrics_url)
    ex = _request(tel)
    deadline = time.monotonic() + 10
    while scraper.count < 3 or scraper.value(IN_FLIGHT) != 1:  # the scraper has seen the request in flight
        assert time.monotonic() < deadline, "the scraper never read the request in flight"
        time.sleep(0.05)
    tel.on_end(ex, time.perf_counter_ns())  # the run's last request ends ...
    t0 = time.monotonic()
    tel.close()  # ... and the run closes at once
    waited = time.monotonic() - t0
    scraper.join()
    assert scraper.value(IN_FLIGHT) == 0 and scraper.value(OK) == 1, "the final values never reached the scraper"
    assert waited < 0.2 * 1.1 + 1.0 + 0.5, f"waited {waited:.2f} s for a scraper reading every 0.2 s"
    err = capsys.readouterr().err
    assert f"keeping {tel.metrics_url} up until Prometheus reads the run's final values" in err


def test_the_url_is_printed_with_the_real_port_and_nobody_scraping_means_no_wait(
        capsys: pytest.CaptureFixture[str]) -> None:
    from itlbench.load.target import Target

    tel = LiveTelemetry.start("0", None)  # --metrics-port 0: a free port
    assert tel is not None and tel.metrics_url is not None
    port = int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])
    assert port > 0
    assert "client metrics" not in capsys.readouterr().err  # said once the run goes on: its server answered
    tel.connect(Target(base_url="http://127.0.0.1:9/v1", model="m"), has_steps=False, provider_name="openai",
                run_info={"run_id": "r"})
    assert f"client metrics for Prometheus: http://127.0.0.1:{port}/metrics" in capsys.readouterr().err
    tel.on_end(_request(tel), time.perf_counter_ns())
    t0 = time.monotonic()
    tel.close()
    assert time.monotonic() - t0 < 0.5
    assert "keeping" not in capsys.readouterr().err


def test_no_wait_before_any_request_or_after_the_scraper_stopped_coming(capsys: pytest.CaptureFixture[str]) -> None:
    tel = LiveTelemetry.start("127.0.0.1:0", None)  # a run that fails before its load: scraped, nothing sent
    assert tel is not None and tel.metrics_url is not None
    urllib.request.urlopen(tel.metrics_url, timeout=5).read()
    t0 = time.monotonic()
    tel.close()
    assert time.monotonic() - t0 < 0.5

    now = [0.0]
    server = MetricsServer("127.0.0.1", 0, CollectorRegistry(), clock=lambda: now[0])
    try:
        for t in (0.0, 5.0):  # two scrapes 5 s apart, then none for 95 s: the scraper has gone
            now[0] = t
            urllib.request.urlopen(server.url, timeout=5).read()
        assert server.interval_s == 5.0
        now[0] = 100.0
        t0 = time.monotonic()
        assert server.linger() is False and time.monotonic() - t0 < 0.1
    finally:
        server.stop()
    assert "keeping" not in capsys.readouterr().err


def test_the_wait_is_bounded_by_the_interval_seen(capsys: pytest.CaptureFixture[str]) -> None:
    registry = CollectorRegistry()
    Counter("x", "x", registry=registry).inc()
    now = [0.0]
    server = MetricsServer("127.0.0.1", 0, registry, clock=lambda: now[0])
    try:
        for t in (10.0, 10.1, 10.2):  # every 0.1 s, the last one just now; the next never comes
            now[0] = t
            urllib.request.urlopen(server.url, timeout=5).read()
        t0 = time.monotonic()
        assert server.linger() is False
        waited = time.monotonic() - t0
    finally:
        server.stop()
    assert 0.9 < waited < 1.5, waited  # one interval (0.1 s) × 1.1 + 1 s of margin
    err = capsys.readouterr().err
    assert "at most 1.1 s" in err and "no scrape came" in err
