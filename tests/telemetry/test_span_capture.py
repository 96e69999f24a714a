"""`--receive-otlp`: a server's real OTLP/HTTP exporter sends request spans into itlbench during a run,
each run keeps its own in RUN/otel_spans.jsonl, and `analyze --attribution otel` reads them unasked."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from itlbench.analysis.otel_attribution import SPANS_FILE, read_spans
from itlbench.cli import app
from itlbench.errors import ConfigError
from itlbench.experiments.served import free_port
from itlbench.telemetry.span_capture import ReceiveSpec
from itlbench.testing.openai_peer import serve_in_thread
from tests.support.traced_peer import TracedConfig, TracedPeer

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
PER_TOKEN = 5e-5  # the peer's prefill: an 8k injection holds every stream ~0.41 s
RUN = ["--no-report", "--model", "peer", "--workload", "fixed:64:40", "--streams", "4", "--duration", "3", "--warmup", "0.5",
       "--no-live"]


def _analyze_otel(run_dir: Path) -> dict[str, Any]:
    res = runner.invoke(app, ["analyze", str(run_dir), "--attribution", "otel"], terminal_width=200)
    assert res.exit_code == 0, res.output
    return json.loads((run_dir / "summary-otel.json").read_text())


def _request_ids(run_dir: Path) -> set[str]:
    from itlbench.rundir import load_tables

    requests = load_tables(run_dir)["requests"]
    return set(requests.filter(requests["status"] == "ok")["server_request_id"].to_list())


@pytest.mark.e2e
def test_a_run_receives_the_servers_spans_and_the_otel_attribution_names_the_injected_prefill(
        tmp_path: Path) -> None:
    port = free_port()
    cfg = TracedConfig(traces_url=f"http://127.0.0.1:{port}/v1/traces", prefill_s_per_token=PER_TOKEN,
                       tick_s=0.01)
    out = tmp_path / "run"
    # 250 tokens at ticks of at least 10 ms: the four streams (in step, one shape) are still streaming
    # when the injection lands at 2.0 s, so its stall is in their gaps, not in their next TTFT
    with serve_in_thread(cfg, peer_cls=TracedPeer) as (_, url):
        res = runner.invoke(app, ["run", "--endpoint", url, "--receive-otlp", str(port), "--inject", "8k@1.5s",
                                  "--out", str(out), *RUN, "--workload", "fixed:64:250"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert f"receiving OTLP spans at http://127.0.0.1:{port}/v1/traces" in " ".join(res.output.split())
    record = json.loads((out / "run.json").read_text())["otel_spans"]
    spans = read_spans(out / SPANS_FILE)
    ids = _request_ids(out)
    # the exporter batches (1 s here): the last spans came after the run ended, and were waited for
    assert record["finished_requests"] == len(ids) >= 5  # each stream's first request and the injection
    assert record["request_spans"] == record["spans"] == len(spans) == len(ids), record
    assert {s["attributes"]["gen_ai.request.id"] for s in spans} == ids
    assert all(s["service"] == "vllm" and s["name"] == "llm_request" for s in spans)

    summary = _analyze_otel(out)  # no --spans: RUN/otel_spans.jsonl is where the run put them
    stalls = summary["stalls"]
    assert stalls["attribution_source"] == "vllm_otel"
    assert stalls["spans"]["matched"] == stalls["spans"]["matched_by_id"] == len(ids)
    (inj,) = stalls["injected_prefills"]
    assert inj["prefill_s"] == pytest.approx(8192 * PER_TOKEN, abs=0.15), inj
    top = max(stalls["attribution"], key=lambda e: e["worst_s"])
    assert top["cause"] == "prefill" and inj["request_id"] in top["injected_request_ids"], stalls["attribution"]


@pytest.mark.e2e
def test_a_sweep_fills_otlp_endpoint_and_each_point_keeps_only_its_own_spans(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    serve = (f"{shlex.quote(sys.executable)} -m tests.support.traced_peer --port {{port}} "
             "--otlp-traces-endpoint {otlp_endpoint} --tick-s {tick}")
    out = tmp_path / "sweep"
    run = [*RUN, "--duration", "2"]
    res = runner.invoke(app, ["sweep", "--serve", serve, "--set", "tick=0.01,0.02", "--receive-otlp", "auto",
                              "--out", str(out), *run], terminal_width=200)
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "sweep.json").read_text())
    seen: set[str] = set()
    for point in manifest["points"]:
        run_dir = out / point["runs"][0]
        doc = json.loads((run_dir / "run.json").read_text())
        assert "--otlp-traces-endpoint http://127.0.0.1:" in doc["sweep"]["serve_command"]
        assert doc["sweep"]["serve_command"].split("--otlp-traces-endpoint ")[1].split()[0] == \
            doc["otel_spans"]["endpoint"]
        spans = read_spans(run_dir / SPANS_FILE)
        # each point has its own server, so request ids repeat (cmpl-1, …): the spans are told apart by time
        ids = _request_ids(run_dir)
        assert {s["attributes"]["gen_ai.request.id"] for s in spans} == ids
        assert len(spans) == len(ids) == doc["otel_spans"]["finished_requests"]
        starts = {s["start_ns"] for s in spans}
        assert not starts & seen
        seen |= starts
        assert _analyze_otel(run_dir)["stalls"]["spans"]["matched_by_id"] == len(ids)


def test_otlp_endpoint_in_a_template_needs_a_receiver(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "--serve", "server --port {port} --otlp {otlp_endpoint}",
                              "--set", "x=1,2", "--out", str(tmp_path / "s")], terminal_width=200)
    assert res.exit_code == 2
    assert "{otlp_endpoint} but nothing receives spans" in res.output and "--receive-otlp auto" in res.output
    res = runner.invoke(app, ["capacity", "--serve", "server --port {port} --otlp {otlp_endpoint}",
                              "--out", str(tmp_path / "c")], terminal_width=200)
    assert res.exit_code == 2 and "--receive-otlp auto" in res.output


@pytest.mark.parametrize(("value", "spec"), [("4318", ReceiveSpec("127.0.0.1", 4318)),
                                             ("0.0.0.0:4318", ReceiveSpec("0.0.0.0", 4318)),
                                             ("auto", ReceiveSpec("127.0.0.1", 0)),
                                             ("[::1]:4318", ReceiveSpec("::1", 4318))])
def test_receive_otlp_values(value: str, spec: ReceiveSpec) -> None:
    assert ReceiveSpec.parse(value) == spec


@pytest.mark.parametrize("value", ["http://x:4318", "host:", "70000", "four"])
def test_a_bad_receive_otlp_names_the_flag_and_the_forms(value: str) -> None:
    with pytest.raises(ConfigError, match="--receive-otlp.*PORT, HOST:PORT or auto"):
        ReceiveSpec.parse(value)


def test_run_refuses_a_bad_receive_otlp_in_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["run", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--receive-otlp", "nope",
                              "--out", str(tmp_path / "r"), "--no-live"], terminal_width=200)
    assert res.exit_code == 2 and "--receive-otlp" in res.output and "Traceback" not in res.output


@pytest.mark.e2e
def test_a_capacity_search_keeps_each_runs_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    serve = f"{shlex.quote(sys.executable)} -m tests.support.traced_peer --port {{port}} --otlp-traces-endpoint {{otlp_endpoint}}"
    out = tmp_path / "cap"
    res = runner.invoke(app, ["capacity", "--serve", serve, "--receive-otlp", "auto", "--model", "peer",
                              "--axis", "streams", "--start", "2", "--rate-max", "4", "--repeat", "1",
                              "--slo", "itl_p99=1s", "--workload", "fixed:64:20", "--duration", "1.5",
                              "--warmup", "0.5", "--no-report", "--out", str(out)], terminal_width=200)
    assert res.exit_code == 0, res.output
    runs = sorted(out.glob("*/run*/run.json"))
    assert len(runs) >= 2, res.output
    for doc_path in runs:
        record = json.loads(doc_path.read_text())["otel_spans"]
        ids = _request_ids(doc_path.parent)
        spans = read_spans(doc_path.parent / SPANS_FILE)
        assert record["request_spans"] == len(spans) == len(ids) > 0, record
        assert {s["attributes"]["gen_ai.request.id"] for s in spans} == ids


def test_sweep_and_capacity_refuse_to_wait_for_spans_the_bundled_engine_never_sends(tmp_path: Path) -> None:
    for cmd in (["sweep", "--chunk-budget", "256,none"], ["capacity"]):
        res = runner.invoke(app, [*cmd, "--engine", "sim", "--receive-otlp", "auto", "--out", str(tmp_path / cmd[0]),
                                  "--duration", "2"], terminal_width=200)
        assert res.exit_code == 2, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: --receive-otlp: receives the spans"), res.output
        assert not (tmp_path / cmd[0]).exists()
