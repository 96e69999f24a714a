"""Live telemetry pieces on their own: the running median and live stall rule against the analysis,
cause attribution, the worst-gap window, flag checking, and that nothing loads when telemetry is off."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
import urllib.request

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from itlbench.analysis.stalls import StallParams, find_stalls
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.bundled_server import server_command
from itlbench.harness.run_config import RunConfig
from itlbench.telemetry.client_metrics import WindowMax
from itlbench.telemetry.live_stalls import RunningMedian, StallDetector
from itlbench.telemetry.options import parse_listen

MS = 1_000_000


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=200))
def test_running_median_is_the_median(values: list[int]) -> None:
    m = RunningMedian()
    for i, v in enumerate(values):
        m.add(v)
        assert m.median() == pytest.approx(statistics.median(values[: i + 1]))


def test_live_rule_flags_what_the_analysis_flags_on_a_stream_seen_whole() -> None:
    """The live rule uses the median so far; where the stall comes late in a stream (the usual case)
    it flags exactly the gaps the post-run analysis flags with the whole stream's median."""
    rng = random.Random(3)
    gaps = [int(rng.uniform(8, 12) * MS) for _ in range(60)] + [400 * MS] + [int(rng.uniform(8, 12) * MS)
                                                                              for _ in range(20)]
    det = StallDetector(lambda c, s: None, factor=5.0, floor_s=0.05)
    median, t, live = RunningMedian(), 0, []
    for g in gaps:
        median.add(g)
        if det.is_stall(median, g):
            live.append(t)
        t += g
    frame = pl.DataFrame({"request_id": ["r"] * len(gaps), "gap_s": [g / 1e9 for g in gaps],
                          "t_prev_ns": [sum(gaps[:i]) for i in range(len(gaps))]})
    flagged = find_stalls(frame, StallParams(factor=5.0, floor_s=0.05))["t_prev_ns"].to_list()
    assert live == flagged == [sum(gaps[:60])]


def _detector(has_steps: bool = True) -> tuple[StallDetector, list[tuple[str, float]]]:
    seen: list[tuple[str, float]] = []
    return StallDetector(lambda cause, gap: seen.append((cause, gap)), has_steps=has_steps, settle_s=2.0,
                         pause_grace_s=0.05), seen


def test_cause_follows_the_steps_that_overlapped_the_gap() -> None:
    det, seen = _detector()
    det.add_step(0, 10 * MS, 0)  # decode
    det.flag(10 * MS, 310 * MS)  # a 300 ms gap, covered by a 280 ms prefill step
    det.add_step(12 * MS, 292 * MS, 4096)
    det.settle(400 * MS)
    assert seen == [], "no step after the gap yet: its evidence may still be on the way"
    det.add_step(300 * MS, 310 * MS, 0)
    det.add_step(312 * MS, 322 * MS, 0)
    det.settle(400 * MS)
    assert seen == [("prefill", pytest.approx(0.3))]


@pytest.mark.parametrize(("steps", "pauses", "cause"), [
    ([(0, 300, 0, 0)], [], "engine"),  # one long non-prefill step
    ([(0, 20, 0, 0), (250, 270, 0, 0)], [], "outside_engine"),  # the engine kept stepping in short steps
    ([(0, 20, 0, 1), (30, 50, 0, 0)], [], "preemption"),
    ([(0, 20, 0, 0)], [(20, 290)], "client"),  # the client's own loop was blocked
    ([], [], "unknown"),
])
def test_causes(steps: list[tuple[int, int, int, int]], pauses: list[tuple[int, int]], cause: str) -> None:
    det, seen = _detector()
    det.flag(0, 300 * MS)
    for a, b, prefill, pre in steps:
        det.add_step(a * MS, b * MS, prefill, pre)
    for a, b in pauses:
        det.add_pause(a * MS, b * MS)
    det.settle(10_000 * MS)  # past settle_s: decided with what arrived
    assert [c for c, _ in seen] == [cause]


def test_without_a_step_log_the_cause_is_unknown_or_client() -> None:
    det, seen = _detector(has_steps=False)
    det.flag(0, 300 * MS)
    det.flag(400 * MS, 700 * MS)
    det.add_pause(400 * MS, 690 * MS)
    det.settle(800 * MS)
    assert [c for c, _ in seen] == ["unknown", "client"]


def test_window_max_keeps_the_worst_gap_for_the_window_only() -> None:
    w = WindowMax(window_s=10)
    s = 1_000_000_000
    w.add(100 * s, 5 * MS)
    w.add(100 * s + 1, 900 * MS)
    w.add(103 * s, 7 * MS)
    assert w.value_s(105 * s) == pytest.approx(0.9)
    assert w.value_s(112 * s) == pytest.approx(0.007)
    assert w.value_s(200 * s) == 0.0


@pytest.mark.parametrize(("text", "expected"), [("9464", ("127.0.0.1", 9464)), ("0.0.0.0:9464", ("0.0.0.0", 9464)),
                                                 ("[::1]:0", ("::1", 0))])
def test_metrics_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(("kw", "flag"), [
    ({"metrics_port": "http"}, "--metrics-port"), ({"metrics_port": "70000"}, "--metrics-port"),
    ({"otlp_endpoint": "collector:4318"}, "--otlp-endpoint"),
    ({"metrics_port": "9464", "workers": 2}, "--metrics-port"),
])
def test_bad_telemetry_flags_name_the_flag(kw: dict, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(**kw).validate()
    assert err.value.field == flag


def test_a_port_in_use_fails_before_anything_starts(tmp_path) -> None:
    from itlbench.telemetry.observer import LiveTelemetry

    first = LiveTelemetry.start("127.0.0.1:0", None)
    assert first is not None and first.metrics_url is not None
    try:
        port = first.metrics_url.rsplit(":", 1)[1].split("/")[0]
        with urllib.request.urlopen(first.metrics_url, timeout=5) as r:
            assert b"itlbench_client_stalls_total" in r.read()
        with pytest.raises(ConfigError) as err:
            LiveTelemetry.start(f"127.0.0.1:{port}", None)
        assert err.value.field == "--metrics-port"
    finally:
        first.close()


@pytest.mark.parametrize(("listen", "hint"), [
    ("198.51.100.7:9464", "use an address of this machine"),  # TEST-NET-2: on no interface here
    ("no-such-host.invalid:9464", "use an address of this machine"),
])
def test_an_address_not_on_this_machine_is_told_so_not_to_choose_a_free_port(listen: str, hint: str) -> None:
    from itlbench.telemetry.observer import LiveTelemetry

    with pytest.raises(ConfigError) as err:
        LiveTelemetry.start(listen, None)
    assert err.value.field == "--metrics-port" and hint in str(err.value), str(err.value)


def test_the_bundled_server_gets_the_otlp_endpoint() -> None:
    cmd = server_command(EngineConfig(model="tiny"), "127.0.0.1", 1234, "http://127.0.0.1:4318")
    assert cmd[-2:] == ["--otlp-endpoint", "http://127.0.0.1:4318"]
    assert "--otlp-endpoint" not in server_command(EngineConfig(model="tiny"), "127.0.0.1", 1234)


def test_nothing_of_telemetry_is_imported_when_it_is_off() -> None:
    """The run, driver, client and server modules load no OpenTelemetry and no telemetry module."""
    code = ("import sys, itlbench.cli, itlbench.harness.orchestrate, itlbench.load.driver, itlbench.server.main; "
            "bad = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'itlbench.telemetry'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_rejects_bad_telemetry_flags_with_exit_code_2() -> None:
    from typer.testing import CliRunner

    from itlbench.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["run", "--metrics-port", "nine", "--duration", "1"])
    assert r.exit_code == 2 and "--metrics-port" in r.output
    r = runner.invoke(app, ["serve", "--otlp-endpoint", "collector:4318"])
    assert r.exit_code == 2 and "--otlp-endpoint" in r.output


def test_a_collector_nobody_runs_is_a_one_line_error_before_the_run(tmp_path) -> None:
    """The SDK would retry every batch in the background, printing a warning each time, and lose the spans."""
    import socket

    from typer.testing import CliRunner

    from itlbench.cli import app

    with socket.socket() as s:  # a port that was free a moment ago, now closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    runner = CliRunner()
    for args in (["run", "--model", "tiny", "--duration", "2s", "--out", str(tmp_path / "run")],
                 ["serve", "--engine", "sim", "--model", "llama-3.1-8b"]):
        r = runner.invoke(app, [*args, "--otlp-endpoint", url], terminal_width=300)
        assert r.exit_code == 2, r.output
        assert f"error: --otlp-endpoint: nothing answers at {url}" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


def test_a_port_that_is_no_otlp_collector_is_a_one_line_error_before_the_run(tmp_path) -> None:
    """A listening port that answers OTLP's POST /v1/traces with 404 (a UI, Prometheus, a proxy) passed the
    connect-only probe: the run went on with a warning per export batch and no spans anywhere."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from typer.testing import CliRunner

    from itlbench.cli import app

    class NotACollector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotACollector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        for args in (["run", "--model", "tiny", "--duration", "2s", "--out", str(tmp_path / "run")],
                     ["serve", "--engine", "sim", "--model", "llama-3.1-8b"]):
            r = CliRunner().invoke(app, [*args, "--otlp-endpoint", url], terminal_width=300)
            assert r.exit_code == 2, r.output
            assert f"error: --otlp-endpoint: {url} is not an OTLP/HTTP collector" in r.output, r.output
            assert "HTTP 404" in r.output and "4318" in r.output and "Traceback" not in r.output
    finally:
        server.shutdown()
    assert not (tmp_path / "run").exists()


def test_a_collector_gone_mid_run_holds_the_end_of_the_run_at_most_a_few_seconds(capsys, monkeypatch) -> None:
    """A collector that stops mid-run left the SDK retrying every buffered batch with backoff at shutdown: the
    run's run.json, summary and report waited about 30 s (8 s for this one batch). The client waits
    OTLP_CLOSE_S (1 s here) and says so."""
    from itlbench.telemetry import observer
    from itlbench.telemetry.observer import LiveTelemetry
    from itlbench.telemetry.otel import make_providers
    from itlbench.telemetry.otlp_receiver import OtlpReceiver

    rx = OtlpReceiver().start()
    providers = make_providers(rx.endpoint, "itlbench-client")
    tracer = providers.tracer("test")
    with tracer.start_as_current_span("before"):
        pass
    rx.stop()  # the collector goes away: nothing listens on its port now
    for i in range(3):
        with tracer.start_as_current_span(f"after-{i}"):
            pass
    monkeypatch.setattr(observer, "OTLP_CLOSE_S", 1.0)
    t0 = time.monotonic()
    LiveTelemetry(None, providers).close()
    assert time.monotonic() - t0 < 3.0
    err = capsys.readouterr().err
    assert f"the OTLP collector at {rx.endpoint} did not take the run's last spans" in err and "Traceback" not in err


def test_missing_sdk_names_the_extra() -> None:
    code = ("import sys; sys.modules['opentelemetry.exporter.otlp.proto.http'] = None\n"
            "from itlbench.errors import ConfigError\nfrom itlbench.harness.run_config import RunConfig\n"
            "try:\n    RunConfig(otlp_endpoint='http://127.0.0.1:4318').validate()\n"
            "except ConfigError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "--otlp-endpoint" in r.stdout and "itlbench[otel]" in r.stdout, r.stdout + r.stderr


def test_span_times_follow_a_wall_clock_that_gains_on_the_monotonic_one() -> None:
    """Spans carry wall-clock times; a wall clock gaining 0.6 % moves them as it moves, where one start-up
    offset would place a time an hour in 21.6 s early. An earlier time keeps the reading of its own moment."""
    from itlbench.telemetry.otel import Clock

    now = [10**12]
    base = 1_700_000_000 * 10**9
    wall = lambda: base + now[0] + (now[0] - 10**12) * 6 // 1000  # noqa: E731
    clock = Clock(wall=wall, perf=lambda: now[0], refresh_ns=100 * MS)
    assert clock.epoch(now[0]) == wall()
    marks = []
    for _ in range(36):  # an hour, a call every 100 s
        now[0] += 100 * 10**9
        marks.append((now[0], wall()))
        assert clock.epoch(now[0]) == wall()
    assert all(clock.epoch(t) == w for t, w in marks)  # each through its own reading, not the latest
    assert clock.epoch(now[0] + 50 * MS) == wall() + 50 * MS  # within refresh_ns: the last reading holds
    assert clock.offset_ns - base == 21_600_000_000  # 0.6 % of an hour


def test_a_served_engine_whose_collector_is_gone_shuts_down_within_its_limit(caplog) -> None:
    """`itlbench serve --otlp-endpoint` SIGTERMed after its collector stopped took about 13 s to exit: the
    SDK retried each buffered batch with backoff. The server waits at most its limit and says the spans are lost."""
    from itlbench.server.tracing import ServerTracing
    from itlbench.telemetry.otel import make_providers
    from itlbench.telemetry.otlp_receiver import OtlpReceiver

    rx = OtlpReceiver().start()
    tracing = ServerTracing(rx.endpoint, "tiny", providers=make_providers(rx.endpoint, "itlbench-server"))
    rx.stop()
    for i in range(3):
        with tracing.tracer.start_as_current_span(f"after-{i}"):
            pass
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="itlbench.server"):
        tracing.shutdown(timeout_s=1.0)
    assert time.monotonic() - t0 < 3.0
    assert "the last spans" in caplog.text and "lost" in caplog.text


def test_a_shutdown_past_its_limit_leaves_no_export_retrying_to_log_its_failure_later(caplog) -> None:
    """Past its limit the shutdown went on in a daemon thread, retrying with backoff, and about 10 s later logged
    "Failed to export spans batch due to timeout, max retries or shutdown." into whatever ran next (a sweep's next
    point; the end of the test session). Now the exporters are stopped at the limit: no thread is left retrying, and
    the SDK's words for that stop are not logged (the caller's own line says the spans are lost)."""
    import threading

    from itlbench.telemetry.otel import make_providers
    from itlbench.telemetry.otlp_receiver import OtlpReceiver

    before = set(threading.enumerate())
    rx = OtlpReceiver().start()
    providers = make_providers(rx.endpoint, "itlbench-client")
    rx.stop()
    for i in range(3):
        with providers.tracer("test").start_as_current_span(f"after-{i}"):
            pass
    with caplog.at_level("WARNING"):
        assert providers.shutdown_within(1.0) is False
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
        assert left == [], f"still exporting after the limit: {left}"
    assert "aborting retry" not in caplog.text and "already shutdown" not in caplog.text, caplog.text


def test_otel_providers_shut_down_once_whoever_asks_first() -> None:
    """The run's end (shutdown_within's thread) and a second caller both shut the providers down: the SDK's
    MeterProvider logged "shutdown can only be called once" on the second call, noise at every run's exit."""
    code = ("from itlbench.telemetry.otel import make_providers\n"
            "p = make_providers('http://127.0.0.1:9', 'test', 60.0)\n"
            "assert p.shutdown_within(5.0)\n"
            "p.shutdown()\n"
            "print('done')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert "can only be called once" not in out.stderr, out.stderr
