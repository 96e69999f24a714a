"""Bad input a user types, as the command line meets it: one line naming the flag and the fix, exit 2, no
directory left behind (the fresh-eyes audit's findings, one test each)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app

runner = CliRunner()
SIM = ["--engine", "sim", "--duration", "1s", "--no-live", "--no-report"]


def _lines(text: str) -> list[str]:
    return [s for s in text.splitlines() if s.strip()]


def _run_is_refused_in_one_line(tmp_path: Path, args: list[str], line: str, command: tuple[str, ...] = ("run", *SIM)
                                ) -> None:
    """`itlbench run` on the simulator (or `command`) with `args` exits 2 with one line starting `line`, and
    writes nothing."""
    out = tmp_path / "out"
    result = runner.invoke(app, [*command, *args, "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and lines[0].startswith(line), result.output
    assert not out.exists()


def test_a_trace_workload_without_a_trace_on_the_simulator_says_to_give_one(tmp_path: Path) -> None:
    """It said "no trace file at '.'": the missing flag read as the current directory."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *SIM, "--workload", "trace", "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --trace: workload 'trace' needs a CSV "
                                     "(pass --trace path/to/AzureLLMInferenceTrace_conv.csv)"], result.output
    assert not out.exists()


def test_phases_lengths_past_the_bundled_context_are_refused_before_the_engine_starts(tmp_path: Path) -> None:
    """The simulator's context is known from its preset: it was started (and its intro printed) first."""
    out = tmp_path / "phases"
    result = runner.invoke(app, ["phases", "--engine", "sim", "--lengths", "200k", "--out", str(out)],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --lengths: no length fits the context (131072 tokens) and --max-prompt "
                                     "(give shorter lengths)"], result.output
    assert not out.exists()


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short simulated run (a virtual clock: about a second) for the commands that read runs."""
    out = tmp_path_factory.mktemp("runs") / "run"
    result = runner.invoke(app, ["run", *SIM, "--streams", "2", "--workload", "fixed:64:8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(("args", "line"), [
    (["--spans", "{tmp}/spans.jsonl"], "error: --spans: only applies to --attribution otel, not engine "
                                       "(add --attribution otel, or drop --spans)"),
    (["--attribution", "client", "--spans", "{tmp}/spans.jsonl"], "error: --spans: only applies to --attribution "
                                                                  "otel, not client"),
    (["--server-log", "{tmp}/sglang.log", "--attribution", "otel"], "error: --server-log: lays SGLang's batches "
                                                                     "beside the client-only attribution"),
    (["--server-log", "{tmp}/sglang.log", "--attribution", "nope"], "error: --attribution: 'nope' is not a source"),
])
def test_analyze_refuses_an_option_its_attribution_would_ignore(sim_run: Path, tmp_path: Path, args: list[str],
                                                                line: str) -> None:
    """--spans without --attribution otel, or --server-log beside it, was silently ignored (exit 0, the engine's
    summary rewritten): the user believed the spans or the log had been read."""
    (tmp_path / "spans.jsonl").write_text("{}\n")
    (tmp_path / "sglang.log").write_text("")
    before = (sim_run / "summary.json").stat().st_mtime_ns
    result = runner.invoke(app, ["analyze", str(sim_run), *[a.replace("{tmp}", str(tmp_path)) for a in args]],
                           terminal_width=400)
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and lines[0].startswith(line), result.output
    assert (sim_run / "summary.json").stat().st_mtime_ns == before


@pytest.mark.parametrize("batch", ["0", "2.5", "-1,8"])
def test_roofline_batch_is_refused_as_a_batch_size_not_a_token_count(batch: str) -> None:
    """--batch counts sequences: it said "'0' is not a whole number of tokens" and to give token counts."""
    result = runner.invoke(app, ["roofline", "--compare", "none", "--batch", batch], terminal_width=400)
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and lines[0].startswith("error: --batch: '"), result.output
    assert "is not a batch size (a whole number of sequences >= 1) (give decode batch sizes such as 1,32)" in lines[0]
    assert "token" not in lines[0]


@pytest.mark.parametrize("value", ["0", "-1"])
def test_serve_refuses_a_max_waiting_that_would_answer_every_request_429(value: str) -> None:
    """A cap below 1 was accepted: the server started and refused every request as over capacity."""
    result = runner.invoke(app, ["serve", "--engine", "sim", "--port", "0", "--max-waiting", value], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [f"error: --max-waiting: must be >= 1, got {value} "
                                     "(e.g. --max-waiting 1024, the default)"], result.output


@pytest.mark.parametrize(("args", "line"), [
    (["--streams", "99999999999"], "error: --streams: must be at most 100,000, got 99,999,999,999 (each stream holds "
                                   "a connection open; e.g. --streams 32, or an open-loop --rate)"),
    (["--inject", "100000000x1k@0.5s"], "error: --inject: plans 100,000,000 injected prompts, more than 100,000"),
    (["--inject", "32k/1us"], "error: --inject: plans 1,000,000 injected prompts, more than 100,000"),
])
def test_a_load_too_large_to_plan_is_refused_not_built(tmp_path: Path, args: list[str], line: str) -> None:
    """Each stream's and each injection's plan is built up front: these ran for minutes, silently, into gigabytes
    (7 GB for the streams, 11 GB for the injections, before a timeout ended them)."""
    _run_is_refused_in_one_line(tmp_path, args, line)


@pytest.mark.parametrize(("args", "line"), [
    (["--streams", "8,200000"], "error: --streams: must be at most 100,000, got 200,000"),
    (["--rate", "1,inf"], "error: --rate: 'inf' is not a positive number (e.g. --rate 1,2,4)"),
])
def test_a_sweep_refuses_a_point_its_runs_would_refuse_before_any_runs(tmp_path: Path, args: list[str],
                                                                      line: str) -> None:
    """It ran the points before, and the refused one was a failed point of a sweep that exited 0."""
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", *args, *SIM[:4], "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and lines[0].startswith(line), result.output
    assert not out.exists()


@pytest.mark.parametrize("command", [["run", *SIM], ["serve", "--engine", "sim", "--port", "0"]])
def test_a_block_larger_than_the_context_is_refused_not_a_traceback(tmp_path: Path, command: list[str]) -> None:
    """The simulator sized its cache in whole blocks, held none, and the block manager's ValueError came out whole."""
    result = runner.invoke(app, [*command, "--block-size", "100000000", "--out" if command[0] == "run" else "--host",
                                 str(tmp_path / "run") if command[0] == "run" else "127.0.0.1"], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --block-size: 100,000,000 tokens is more than the 131,072-token "
                                     "context (e.g. --block-size 16, vLLM's default)"], result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("command", "tp", "room"), [
    (["run", *SIM], [], "33,121) (use --kv-blocks 33121 or less"),
    (["run", *SIM], ["--tp", "4"], "155,458) (use --kv-blocks 155458 or less"),
    (["serve", "--engine", "sim", "--port", "0"], [], "33,121) (use --kv-blocks 33121 or less"),
])
def test_sim_kv_blocks_past_the_gpus_memory_are_refused_not_listed(tmp_path: Path, command: list[str],
                                                                   tp: list[str], room: str) -> None:
    """--kv-blocks was taken as given: the block manager listed 10^12 blocks until the run was killed (6.4 GB at
    40 s). The room is the default's arithmetic on the whole GPU beside the weight shard (--tp splits both)."""
    out = ["--out", str(tmp_path / "run")] if command[0] == "run" else []
    result = runner.invoke(app, [*command, *tp, "--kv-blocks", "1000000000000", *out], terminal_width=400)
    assert result.exit_code == 2, result.output
    tp_text = " at --tp 4" if tp else ""
    assert _lines(result.output) == [f"error: --kv-blocks: 1,000,000,000,000 blocks of 16 tokens do not fit beside "
                                     f"llama-3.1-8b's weights on the H100 SXM{tp_text} (room for {room}, or leave it "
                                     "out to size it from memory)"], result.output
    assert not (tmp_path / "run").exists()


def test_sim_kv_blocks_that_fit_the_whole_gpu_run(tmp_path: Path) -> None:
    """The most the refusal names is accepted: it is the whole GPU beside the weights, not the default's 90 %."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *SIM, "--streams", "1", "--workload", "fixed:64:8", "--kv-blocks", "33121",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["engine"]["kv_blocks"] == 33121


TORCH_POOLS = [
    ("--kv-blocks", "1000000000000", "error: --kv-blocks: a K/V pool of 22,888,183.6 GiB (1,000,000,000,000 blocks "
                                     "of 16 tokens) is more than the "),
    ("--block-size", "1000000000", "error: --block-size: a K/V pool of 2,861.0 GiB (blocks of 1,000,000,000 tokens, more "
                                  "than the 65,536-token context) is more than this machine's "),
]


@pytest.mark.parametrize(("flag", "value", "line"), TORCH_POOLS)
def test_a_torch_kv_pool_past_memory_is_refused_by_run_in_the_engines_one_line(tmp_path: Path, flag: str,
                                                                              value: str, line: str) -> None:
    """mmap's "Cannot allocate memory" came out with the server log's traceback; now the engine's one line, which
    `run` passes on without the log around it, and no run directory."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--duration", "1s", "--no-live", "--no-report", "--out", str(out), flag,
                                 value], terminal_width=400)
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert lines[-1].startswith(line) and lines[-1].count("error:") == 1, result.output
    assert "Traceback" not in result.output and "its log" not in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value", "line"), TORCH_POOLS)
def test_a_torch_kv_pool_past_memory_is_refused_by_serve_in_one_line(flag: str, value: str, line: str) -> None:
    """`serve` restarts itself (malloc tunables) before its engine starts, so it runs as the user runs it."""
    done = subprocess.run([sys.executable, "-m", "itlbench", "serve", "--host", "127.0.0.1", "--port", "0", flag,
                           value], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = _lines(done.stdout + done.stderr)
    assert lines[-1].startswith(line) and "Traceback" not in done.stderr, done.stderr


class _Page(http.server.BaseHTTPRequestHandler):
    """Any GET answers 200 with `body` as `content_type`: a web server's page where an API was expected."""

    content_type = "text/html; charset=utf-8"
    body = b"<!DOCTYPE html>\n<html>\n<head><title>Welcome to nginx!</title></head>\n<body>...</body></html>\n"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def page_server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Page", (_Page,), dict(request.param))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("page_server", "said"), [
    ({}, "(text/html; charset=utf-8: '<!DOCTYPE html> <html> <head><title>Welcome to nginx!</title')"),
    ({"content_type": "text/plain", "body": b"Bad Gateway \xe9t\xe9"}, "(text/plain: 'Bad Gateway \ufffdt\ufffd')"),
], indirect=["page_server"])
def test_an_endpoint_answering_a_page_says_it_is_not_json_and_where_to_point(tmp_path: Path, page_server: str,
                                                                             said: str) -> None:
    """It said "failed: Expecting value: line 1 column 1 (char 0)" (and, for bytes that are not UTF-8, the codec's
    complaint): nothing about what answered or what --endpoint should be."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--endpoint", page_server, "--duration", "1s", "--no-live", "--no-report",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [f"probing {page_server}",  # the status line before the probe
                                     f"error: --endpoint: {page_server}/models answered something that is not JSON "
                                     f"{said} (point --endpoint at an OpenAI-compatible base URL ending in /v1, e.g. "
                                     "http://localhost:8000/v1)"], result.output
    assert not out.exists()


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://127.0.0.1:99999/v1", "'http://127.0.0.1:99999/v1': the port must be a whole number from 1 to 65535, got 99999"),
    ("http://127.0.0.1:0/v1", "'http://127.0.0.1:0/v1': the port must be a whole number from 1 to 65535, got 0"),
    ("http://127.0.0.1:eighty/v1", "'http://127.0.0.1:eighty/v1': the port must be a whole number from 1 to 65535, got eighty"),
    ("http://[::1/v1", "'http://[::1/v1' is not a valid URL (Invalid IPv6 URL)"),
    ("http:///v1", "'http:///v1' names no host"),
    ("http://local host:8000/v1", "'http://local host:8000/v1' holds a space or a control character"),
])
def test_an_endpoint_that_is_not_a_url_is_refused_before_it_is_probed(tmp_path: Path, endpoint: str,
                                                                      problem: str) -> None:
    """Port 99999 and an unclosed IPv6 bracket were probed ("probing ..."), then failed as urllib's ValueError."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--endpoint", endpoint, "--duration", "1s", "--no-live", "--no-report",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [f"error: --endpoint: {problem} (e.g. --endpoint http://127.0.0.1:8000/v1)"], \
        result.output
    assert not out.exists()


@pytest.mark.parametrize(("args", "line"), [
    (["run", *SIM, "--slo", ","], "error: --slo: ',' lists no target (e.g. 'ttft:le2k=2s,itl_p99=150ms,"
                                  "injected/ttft=off'; buckets: le128, le512, le2k, le8k, le32k, gt32k; or leave --slo "
                                  "out for the defaults)"),
    (["phases", "--engine", "sim", "--lengths", ""], "error: --lengths: '' lists no length (e.g. --lengths "
                                                     "1,16,128,512,2k, or leave it out for the defaults)"),
    (["phases", "--engine", "sim", "--lengths", " , "], "error: --lengths: ' , ' lists no length (e.g. --lengths "
                                                        "1,16,128,512,2k, or leave it out for the defaults)"),
    (["roofline", "--compare", ","], "error: --compare: ',' lists no GPU (e.g. --compare h100,h200, or --compare "
                                     "none)"),
])
def test_a_list_naming_nothing_is_refused_not_read_as_the_defaults(tmp_path: Path, args: list[str], line: str) -> None:
    """--slo ',' and --lengths '' ran with the default SLOs and lengths, silently."""
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, *(["--out", str(out)] if args[0] != "roofline" else [])], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [line], result.output
    assert not out.exists()


def test_roofline_compares_each_gpu_once_in_the_order_given() -> None:
    """--compare h100,h100 showed the H100 twice; an alias (h100-sxm) is the same GPU."""
    result = runner.invoke(app, ["roofline", "--compare", "a100,h100,h100-sxm,a100,h100", "--json"])
    assert result.exit_code == 0, result.output
    assert [g["gpu"] for g in json.loads(result.output)["gpus"]] == ["a100", "h100"]


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://127.0.0.1:99999", "'http://127.0.0.1:99999': the port must be a whole number from 1 to 65535, got 99999"),
    ("http://127.0.0.1:eighty", "'http://127.0.0.1:eighty': the port must be a whole number from 1 to 65535, got eighty"),
    ("http://[::1", "'http://[::1' is not a valid URL (Invalid IPv6 URL)"),
    ("http:///v1/traces", "'http:///v1/traces' names no host"),
    ("http://local host:4318", "'http://local host:4318' holds a space or a control character"),
    ("collector:4318", "'collector:4318' is not an http(s) URL"),
])
@pytest.mark.parametrize("command", [["run", "--model", "tiny", "--duration", "1s", "--no-live", "--no-report"],
                                     ["serve", "--engine", "sim", "--model", "llama-3.1-8b"]])
def test_an_otlp_endpoint_that_is_not_a_url_is_refused_before_it_is_probed(tmp_path: Path, command: list[str],
                                                                           endpoint: str, problem: str) -> None:
    """Port 99999 and an unclosed IPv6 bracket reached the collector probe and ended in urllib's ValueError
    traceback; --otlp-endpoint now shares --endpoint's URL check."""
    out = tmp_path / "run"
    args = [*command, "--out", str(out)] if command[0] == "run" else command
    result = runner.invoke(app, [*args, "--otlp-endpoint", endpoint], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == [f"error: --otlp-endpoint: {problem} (e.g. --otlp-endpoint http://127.0.0.1:4318)"], \
        result.output
    assert not out.exists()


@pytest.mark.parametrize(("args", "line"), [
    (["--clock", "virtual", "--api-key", "k"], "error: --api-key: only authenticates to a server given with "
                                               "--endpoint; the bundled engine itlbench starts is given no key "
                                               "(drop --api-key, or measure a server with --endpoint URL)"),
    (["--clock", "real", "--api-key=k"], "error: --api-key: only authenticates to a server given with --endpoint"),
    (["--locust-ui-port", "9000"], "error: --locust-ui-port: only applies to --driver locust (add --driver locust "
                                   "or drop it)"),
    (["--driver", "locust", "--locust-ui-port", "9000"], "error: --locust-ui-port: is the port of Locust's web UI, "
                                                         "which only --locust-ui serves (add --locust-ui or drop "
                                                         "--locust-ui-port)"),
])
def test_run_refuses_an_option_that_would_not_apply(tmp_path: Path, args: list[str], line: str) -> None:
    """Each was silently ignored (exit 0): a key no server checks (the bundled engine's server is started without
    one; the virtual clock has none), a web UI port with no web UI."""
    _run_is_refused_in_one_line(tmp_path, args, line)


def test_a_key_in_the_environment_is_not_refused_where_no_server_checks_it(tmp_path: Path) -> None:
    """ITLBENCH_API_KEY may be exported for `itlbench serve` or an --endpoint run: only the typed flag is refused."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *SIM, "--clock", "virtual", "--streams", "2", "--workload", "fixed:64:8",
                                 "--brief", "--out", str(out)], env={"ITLBENCH_API_KEY": "k"}, terminal_width=400)
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").is_file() and "--api-key" not in result.output


def test_a_sweep_whose_first_run_refuses_its_options_says_only_the_error(tmp_path: Path) -> None:
    """It printed "sweep point 1/1: b512" before the run's own error, as if the point had started."""
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--chunk-budget", "512", "--engine", "sim", "--burstiness", "2",
                                 "--out", str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert _lines(result.output) == ["error: --burstiness: only shapes --rate arrivals (add --rate R or drop "
                                     "--burstiness)"], result.output
    assert not out.exists()


def test_phases_refuses_a_typed_api_key_without_an_endpoint(tmp_path: Path) -> None:
    """As `run`'s: the bundled engine's server is started without a key, so a typed one authenticated to nothing."""
    _run_is_refused_in_one_line(tmp_path, ["--api-key=k"], "error: --api-key: only authenticates to a server "
                                "given with --endpoint", command=("phases", "--engine", "sim"))


@pytest.mark.parametrize("record", ["run.json", "sweep.json", "compare.json"])
def test_report_out_never_replaces_another_directorys_report(tmp_path: Path, record: str) -> None:
    """`itlbench report A --out B` wrote A's report over B's report.html (a run's, or a sweep's comparison), to be
    read as B's; compare already refused such an --out."""
    from tests.support.report_runs import build_run

    run = build_run(tmp_path / "a")
    other = tmp_path / "b"
    other.mkdir()
    (other / record).write_text("{}")
    (other / "report.html").write_text("b's report")
    result = runner.invoke(app, ["report", str(run), "--out", str(other)], terminal_width=400)
    assert result.exit_code == 2, result.output
    what = {"run.json": "a run", "sweep.json": "a sweep", "compare.json": "a comparison"}[record]
    assert _lines(result.output) == [f"error: --out: {other} holds {what} ({record}), whose report.html this run's "
                                     "would replace (choose a new directory, or leave --out out to write into "
                                     "RUN_DIR)"]
    assert (other / "report.html").read_text() == "b's report" and not (other / "report.md").exists()
