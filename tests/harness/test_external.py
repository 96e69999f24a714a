"""Measuring an external engine honestly, against the stand-in peer (itlbench.testing.openai_peer):
fresh prompts per run, cached tokens, token-id prompts, /metrics read outside the window, and
servers that answer wrongly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import polars as pl
import pytest

from itlbench.analysis.stalls import StallParams, analyze_stalls
from itlbench.analysis.starvation import pause_breakdown
from itlbench.errors import ConfigError
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.load.clients.sse import StreamClient
from itlbench.load.observers.client_monitor import PauseWatchdog
from itlbench.load.target import Target
from itlbench.rundir.reader import read_run_doc, read_table
from itlbench.rundir.schema import frame
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread
from itlbench.workloads.build import LoadSpec, build_load_plan
from itlbench.workloads.plan import RequestPlan
from itlbench.workloads.prompts import PromptBuilder

MS = 1_000_000


def _cfg(url: str, out: Path, **kw: object) -> RunConfig:
    base: dict[str, object] = dict(endpoint=url, model="peer", workload="chat-short", streams=2, duration_s=1.0,
                                   warmup_s=0.0, inject="300@0.3s", drain_timeout_s=10.0, request_timeout_s=10.0,
                                   out=out)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def _first_plans(spec: LoadSpec, n: int = 3) -> list[RequestPlan]:
    plan = build_load_plan(spec)
    return [next(plan.streams[0]) for _ in range(n)] + list(plan.open_loop)


# ---- fresh prompts per run ---------------------------------------------------------------------------

@pytest.mark.parametrize("token_ids", [True, False])
def test_salted_prompts_differ_per_run_and_keep_lengths_and_times(token_ids: bool) -> None:
    spec = LoadSpec(workload="rag", streams=2, duration_s=10, inject="2k@3s", seed=4, token_ids=token_ids,
                    vocab_size=4096)
    a = _first_plans(LoadSpec(**{**spec.__dict__, "prompt_salt": "aa"}))
    b = _first_plans(LoadSpec(**{**spec.__dict__, "prompt_salt": "bb"}))
    again = _first_plans(LoadSpec(**{**spec.__dict__, "prompt_salt": "aa"}))
    unsalted = _first_plans(spec)
    assert [(p.prompt_tokens, p.max_tokens, p.send_at_s) for p in a] == \
        [(p.prompt_tokens, p.max_tokens, p.send_at_s) for p in b]
    body = (lambda p: p.prompt_token_ids) if token_ids else (lambda p: p.prompt_text)
    for x, y in zip(a, b, strict=True):
        assert body(x) != body(y)
        if token_ids:
            assert len(x.prompt_token_ids or ()) == len(y.prompt_token_ids or ()) == x.prompt_tokens
        else:
            assert len((x.prompt_text or "").split()) == len((y.prompt_text or "").split())
    assert [body(p) for p in a] == [body(p) for p in again]  # a salt reproduces its run
    assert [body(p) for p in unsalted] != [body(p) for p in a]
    # within a run (one salt, one builder per worker process) a document is the same everywhere
    docs = [PromptBuilder(token_ids=token_ids, vocab_size=4096, seed=4, salt=salt).shared("doc-3", 500)
            for salt in ("aa", "aa", "bb")]
    assert docs[0] == docs[1] != docs[2] and docs[0].tokens == docs[2].tokens == 500


def test_default_runs_send_fresh_prompts_and_reused_ones_show_the_cache(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002)) as (peer, url):
        fresh = [run_load_test(_cfg(url, tmp_path / f"fresh{i}"))[1] for i in range(2)]
        reused = [run_load_test(_cfg(url, tmp_path / f"reuse{i}", reuse_prompts=True))[1] for i in range(2)]
    salts = [read_run_doc(tmp_path / f"fresh{i}")["plan"]["prompt_salt"] for i in range(2)]
    assert salts[0] and salts[0] != salts[1]
    assert read_run_doc(tmp_path / "reuse1")["plan"]["prompt_salt"] is None
    for s in fresh:
        (inj,) = s["cache"]["injected"]
        assert inj["prompt_tokens"] == 300 and inj["cached_tokens"] == 0 and not s["cache"]["warnings"]
    first, second = (r["cache"]["injected"][0] for r in reused)
    assert first["cached_tokens"] == 0 and second["cached_tokens"] == 288  # 18 full blocks of 16
    (warning,) = reused[1]["cache"]["warnings"]
    assert "inj-000" in warning and "288 of its 300" in warning
    requests = read_table(tmp_path / "reuse1", "requests")
    assert requests["cached_tokens_reported"].null_count() == 0
    assert reused[1]["cache"]["server"]["hit_fraction"] > 0


# ---- token-id prompts ------------------------------------------------------------------------------

def test_prompt_format_auto_picks_ids_where_accepted(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002, vocab_size=3000)) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "ids"))
        prompts = peer.counters.prompts
    fmt = read_run_doc(run_dir)["prompt_format"]
    assert fmt["used"] == "ids" and fmt["vocab_size"] == 3000
    generated = prompts[-5:]  # the last requests: the load's own
    assert all(isinstance(t, int) and 10 <= t < 3000 for p in generated for t in p)
    assert summary["crosscheck"]["prompt_tokens"]["exact"] == summary["crosscheck"]["prompt_tokens"]["checked"] > 0
    assert read_run_doc(run_dir)["plan"]["prompt_mode"] == "token_ids"


def test_prompt_format_auto_falls_back_to_text_and_ids_insists(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002, accept_ids=False)) as (_, url):
        run_dir, _ = run_load_test(_cfg(url, tmp_path / "auto"))
        with pytest.raises(ConfigError) as err:
            run_load_test(_cfg(url, tmp_path / "ids", prompt_format="ids"))
    fmt = read_run_doc(run_dir)["prompt_format"]
    assert fmt["used"] == "text" and "HTTP 400" in fmt["reason"]
    assert read_run_doc(run_dir)["plan"]["prompt_mode"] == "text"
    assert err.value.field == "--prompt-format" and not (tmp_path / "ids").exists()


def test_without_model_the_endpoints_only_model_is_measured_and_several_are_named(tmp_path: Path) -> None:
    """--model may be left out where /v1/models lists one model (vLLM's `bench serve` takes it too); where it lists
    several, the run stops before sending anything and names them, since any guess could measure the wrong one."""
    with serve_in_thread(PeerConfig(tick_s=0.002, model="only-one")) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "one", model=None))
        asked = peer.counters.requests
    doc = read_run_doc(run_dir)
    assert doc["config"]["model"] == "only-one" and doc["engine"]["model_from"] == "the only model GET /v1/models lists"
    assert summary["requests"]["ok"] > 0 and asked >= summary["requests"]["ok"]
    with serve_in_thread(PeerConfig(tick_s=0.002, model="a", other_models=("b", "c"))) as (peer, url):
        with pytest.raises(ConfigError) as err:
            run_load_test(_cfg(url, tmp_path / "several", model=None))
        assert peer.counters.requests == 0
    assert err.value.field == "--model" and "serves 3 models" in str(err.value) and "a, b, c" in str(err.value)
    assert not (tmp_path / "several").exists()


# ---- /metrics outside the window -------------------------------------------------------------------

def test_metrics_are_read_just_outside_the_window_by_default(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002)) as (_, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "edges"))
        periodic_dir, periodic = run_load_test(_cfg(url, tmp_path / "periodic", scrape_interval_s=0.2))
    doc = read_run_doc(run_dir)
    scrapes = read_table(run_dir, "scrapes").sort("start_ns")
    assert scrapes["reason"].to_list() == ["baseline", "final"] and set(scrapes["status"]) == {"ok"}
    assert scrapes["end_ns"][0] <= doc["measure_start_ns"] and scrapes["start_ns"][1] >= doc["end_ns"]
    assert summary["scrapes"]["in_window"] == 0
    assert summary["split"]["source"].startswith("server_metrics:vllm") and summary["split"]["decode_s"] > 0
    assert summary["split"]["counters_read"]["start_offset_s"] <= 0 <= summary["split"]["counters_read"]["end_offset_s"]
    assert doc["metrics"]["scrapes"] == 2
    assert periodic["scrapes"]["by_reason"]["periodic"] >= 3 and periodic["scrapes"]["in_window"] >= 2
    ok = read_table(periodic_dir, "scrapes").filter(pl.col("status") == "ok")  # the last may be cut at the end
    assert read_table(periodic_dir, "server_metrics")["t_ns"].n_unique() == ok.height >= 5


def test_a_gap_under_a_scrape_gets_the_scrape_cause() -> None:
    # two streams ticking every 10 ms; both stall 400 ms at t = 1 s, once under a scrape and once not
    rows = []
    for rid in ("a", "b"):
        t = 0
        for i in range(300):
            t += 400 * MS if i in (100, 200) else 10 * MS
            rows.append({"request_id": rid, "t_prev_ns": t - (400 * MS if i in (100, 200) else 10 * MS), "t_ns": t,
                         "gap_s": 0.4 if i in (100, 200) else 0.01, "injected": False})
    gaps = pl.DataFrame(rows)
    under = gaps.filter(pl.col("gap_s") > 0.1)["t_prev_ns"].min()
    scrapes = frame("scrapes", [{"start_ns": under + 5 * MS, "end_ns": under + 390 * MS, "reason": "periodic"}])
    pauses = frame("client_pauses", [{"start_ns": under + 10 * MS, "end_ns": under + 380 * MS, "kind": "loop"}])
    report = analyze_stalls(gaps, frame("steps", []), frame("requests", []), StallParams(), 0, pauses, scrapes)
    causes = report.stalls.sort("t_prev_ns")["cause"].to_list()
    assert causes[:2] == ["scrape", "scrape"]  # not "client", although the client paused in it
    assert causes[2:] == ["unknown", "unknown"]  # no step log, no scrape, no pause: unknown, counted as such
    assert report.stalls.sort("t_prev_ns")["unknown_reason"].to_list()[2:] == ["no_step_log", "no_step_log"]
    assert report.summary["by_cause"]["scrape"]["count"] == 2 and report.summary["overlapping_scrape"] == 2
    assert report.summary["by_cause"]["unknown"]["count"] == 2
    assert {e["cause"] for e in report.summary["attribution"]} == {"scrape", "unknown"}
    # a client starved of CPU under the same scrape: its stall is the client's, not the scrape's
    starved = pauses.with_columns(pl.lit(0.0).alias("cpu_s"), pl.lit(0.37).alias("runq_s"))
    report = analyze_stalls(gaps, frame("steps", []), frame("requests", []), StallParams(), 0, starved, scrapes)
    assert report.stalls.sort("t_prev_ns")["cause"].to_list()[:2] == ["client", "client"]


# ---- servers that answer wrongly -------------------------------------------------------------------

@pytest.mark.parametrize("fault, kind, words", [
    ("html", "not_sse", "text/html"),
    ("non_sse", "not_sse", "application/json"),
    ("truncated", "truncated", "unfinished event"),
    ("bad_json", "bad_json", "invalid JSON"),
    ("close_mid_stream", "closed", "mid-stream"),
])
def test_a_bad_server_gives_failed_rows_and_a_summary_line(tmp_path: Path, fault: str, kind: str,
                                                            words: str) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002, fault=fault)) as (_, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / fault, adaptive_warmup=False))
    requests = read_table(run_dir, "requests")
    failed = requests.filter(pl.col("status") == "error")
    assert failed.height and set(failed["error_kind"]) == {kind}
    assert all(words in e for e in failed["error"])
    line = summary["failures"]["line"]
    assert summary["failures"]["by_kind"][kind]["count"] == summary["failures"]["count"] > 0
    assert line.startswith(f"{summary['failures']['count']} of ") and kind in line and words in line
    assert (run_dir / "summary.json").is_file() and summary["requests"]["ok"] == 0


def test_a_500_mid_run_fails_those_requests_only(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(tick_s=0.002, fault="fail_after", fail_after=2)) as (_, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "500", adaptive_warmup=False))
    requests = read_table(run_dir, "requests")
    assert requests.filter(pl.col("status") == "ok").height >= 1
    failed = requests.filter(pl.col("status") == "error")
    assert set(failed["error_kind"]) == {"http_status"} and set(failed["http_status"]) == {500}
    assert "HTTP 500: Internal Server Error" in failed["error"][0]
    # every request failing in a row ends the run early, with its reason kept
    assert "requests in a row failed, the last with HTTP 500: Internal Server Error" in read_run_doc(run_dir)["aborted_reason"]
    assert summary["failures"]["by_kind"]["http_status"]["count"] >= 1


def test_headers_that_never_come_time_out_as_no_headers(tmp_path: Path) -> None:
    with serve_in_thread(PeerConfig(fault="no_headers")) as (_, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "hang", adaptive_warmup=False, inject=None,
                                              request_timeout_s=0.3, duration_s=0.5))
    requests = read_table(run_dir, "requests")
    assert requests.height >= 2 and set(requests["error_kind"]) == {"no_headers"}
    assert set(requests["status"]) <= {"timeout", "cancelled"} and requests["http_status"].null_count() == requests.height
    assert "no_headers" in summary["failures"]["line"]


def test_an_idle_connection_is_not_reused_after_the_server_dropped_it() -> None:
    """A client loop paused past the server's keep-alive limit must not write into the connection
    the server closed meanwhile (the 'Can not write request body' failure seen against vLLM)."""
    async def two_requests(url: str, idle_s: float) -> list[str]:
        out = []
        async with StreamClient(Target(url, "peer"), _Rows(), idle_connection_s=idle_s) as client:
            for i in range(2):
                plan = RequestPlan(f"r{i}", "chat", "chat", 4, 3, prompt_token_ids=(11, 12, 13, 14))
                out.append((await client.run(plan, time.perf_counter_ns())).status)
                time.sleep(1.5)  # the loop stalls (on purpose) past the peer's 1 s keep-alive limit
        return out

    with serve_in_thread(PeerConfig(tick_s=0.001, keepalive_s=1.0)) as (_, url):
        assert asyncio.run(two_requests(url, idle_s=0.5)) == ["ok", "ok"]


class _Rows:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, object]]] = {}

    def add(self, table: str, row: dict[str, object]) -> None:
        self.rows.setdefault(table, []).append(row)


# ---- where a paused loop's time went ------------------------------------------------------------------

def test_pauses_spent_waiting_for_a_cpu_are_named_starvation() -> None:
    starved = frame("client_pauses", [
        {"start_ns": 0, "end_ns": 2000 * MS, "kind": "loop", "cpu_s": 0.01, "runq_s": 1.97},
        {"start_ns": 3000 * MS, "end_ns": 3100 * MS, "kind": "loop", "cpu_s": 0.0, "runq_s": 0.1},
        {"start_ns": 4000 * MS, "end_ns": 4020 * MS, "kind": "gc"}])
    out = pause_breakdown(starved)
    assert out["count"] == 3 and out["wall_s"] == pytest.approx(2.12) and out["runq_s"] == pytest.approx(2.07)
    assert out["starved_fraction"] == pytest.approx(2.07 / 2.1) and "without a CPU" in out["line"]
    busy = frame("client_pauses", [{"start_ns": 0, "end_ns": 2000 * MS, "kind": "loop", "cpu_s": 1.9,
                                    "runq_s": 0.05}])
    assert pause_breakdown(busy)["line"] is None  # the client's own work: not starvation
    brief = frame("client_pauses", [{"start_ns": 0, "end_ns": 20 * MS, "kind": "loop", "cpu_s": 0.0,
                                     "runq_s": 0.02}])
    assert pause_breakdown(brief)["line"] is None  # too short to make a stall



def test_loop_pauses_say_whether_the_loop_worked_or_slept() -> None:
    rows: list[dict[str, object]] = []

    async def main() -> None:
        dog = asyncio.create_task(PauseWatchdog(rows.append, threshold_s=0.05).run())
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # blocked in a system call
        await asyncio.sleep(0.05)
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # busy on the loop
            pass
        await asyncio.sleep(0.05)
        dog.cancel()
        await asyncio.gather(dog, return_exceptions=True)

    asyncio.run(main())
    loops = [r for r in rows if r["kind"] == "loop" and (r["end_ns"] - r["start_ns"]) > 0.2e9]  # type: ignore[operator]
    if not loops or "cpu_s" not in loops[0]:
        pytest.skip("no per-thread schedstat on this kernel")
    slept, busy = loops[0], loops[-1]
    wall = lambda r: (r["end_ns"] - r["start_ns"]) / 1e9  # noqa: E731
    assert slept["cpu_s"] < 0.2 * wall(slept)
    assert busy["cpu_s"] + busy["runq_s"] > 0.8 * wall(busy) and busy["cpu_s"] > slept["cpu_s"]


def test_a_rate_limited_server_is_waited_out_not_aborted_and_the_waits_recorded(tmp_path: Path) -> None:
    """Every other request gets a 429 with Retry-After: 1 s. Each stream waits before its next send, so the
    run is not 50 refusals in milliseconds, and run.json says how long the server made it wait."""
    with serve_in_thread(PeerConfig(tick_s=0.002, fault="rate_limited", retry_after="1")) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "429", adaptive_warmup=False, inject=None,
                                              duration_s=2.5))
    doc = read_run_doc(run_dir)
    assert "aborted_reason" not in doc and doc["stop_reason"] == "completed"
    requests = read_table(run_dir, "requests")
    assert requests.filter(pl.col("http_status") == 429).height >= 2 and summary["requests"]["ok"] >= 2
    assert requests.height < 20  # two streams, each waiting 1 s after each refusal: not hundreds
    limited = doc["rate_limited"]
    assert limited["waits"] >= 2 and limited["with_retry_after"] == limited["waits"] and limited["max_wait_s"] == 1.0


@pytest.mark.parametrize(("fault", "flag", "fix"), [("chat_only", "--api", "use --api chat"),
                                                    ("unknown_model", "--model", "--model")])
def test_a_404_at_the_probe_is_bad_input_naming_the_flag_and_leaves_no_run_dir(tmp_path: Path, fault: str,
                                                                               flag: str, fix: str) -> None:
    with serve_in_thread(PeerConfig(fault=fault)) as (_, url):
        with pytest.raises(ConfigError) as info:
            run_load_test(_cfg(url, tmp_path / fault, inject=None))
    assert info.value.field == flag and fix in info.value.fix and "HTTP 404" in str(info.value)
    assert "'detail'" not in str(info.value)  # the server's JSON as sent, never a Python dict repr
    assert not (tmp_path / fault).exists()


def test_an_untrusted_certificate_says_so_and_how_to_trust_it(tmp_path: Path) -> None:
    """A TLS verify failure is named as such, with SSL_CERT_FILE as the fix (not 'check the URL')."""
    import ssl
    import urllib.error

    from itlbench.harness import connect as connect_mod

    def refuse(*_a: object, **_k: object) -> None:
        raise urllib.error.URLError(ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] "
                                                                    "self-signed certificate"))

    orig = connect_mod.request_json
    connect_mod.request_json = refuse  # type: ignore[assignment]
    try:
        with pytest.raises(ConfigError) as info:
            run_load_test(_cfg("https://127.0.0.1:1/v1", tmp_path / "tls", inject=None))
    finally:
        connect_mod.request_json = orig
    assert "certificate was not trusted" in str(info.value) and "SSL_CERT_FILE=/path/ca.pem" in info.value.fix
    assert "check the URL" not in str(info.value) and not (tmp_path / "tls").exists()
