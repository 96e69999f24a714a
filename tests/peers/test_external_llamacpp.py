"""Measuring a real llama.cpp server (`llama-server`, built by `benchmarks/peers/install_llamacpp.sh`)
serving the bundled engine's seeded weights as GGUF; runs where the binary is built (else skipped with
that reason, like the vLLM peer tests).

llama.cpp holds back a token whose bytes end mid-character and sends its text with the next chunk
(random weights draw such byte tokens often; even its `logprobs` then list only one token), so the
chunks undercount and `crosscheck.output_tokens.unseen` says by how much (measured: 5 of 300).

What must hold: every request completes; llama.cpp's `usage.completion_tokens` equals its `timings.predicted_n`
and the forced length, and the client's count falls short only by the held-back tokens; the client's TTFT is never shorter than llama.cpp's
prompt evaluation and its decode span agrees with llama.cpp's generation time within what the loopback
path explains; the prefill:decode split comes from llama.cpp's `/metrics`; the engine is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.peers.llamacpp_server import LlamaCppConfig, LlamaCppServer, llamacpp_executable
from itlbench.export.gguf import export_gguf
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir.reader import read_table

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_executable() is None,
                       reason="llama-server not built (benchmarks/peers/install_llamacpp.sh ~/peers/llama.cpp)"),
]

# the loopback path's share of a decode span (the largest excess seen here: 0.54 ms): the first and last chunks' delivery (well under a ms each
# on an idle box) plus scheduling jitter of two processes on a loaded 2-core box
DECODE_BOUND_MS = 5.0


def test_a_run_against_llamacpp_agrees_with_its_own_timings(tmp_path: Path) -> None:
    gguf = export_gguf("cpu-small", tmp_path / "cpu-small.gguf").path
    cfg = LlamaCppConfig(model_path=gguf, chunk_budget=512, n_parallel=8, log_path=tmp_path / "llama.log")
    with LlamaCppServer(cfg) as srv:
        run = RunConfig(endpoint=srv.base_url, model=srv.model, workload="chat-short", streams=4,
                        duration_s=8.0, warmup_s=1.0, inject="2k@3s", seed=3, scrape_interval_s=1.0,
                        out=tmp_path / "run")
        summary = run_load_test(run)[1]
    req = read_table(tmp_path / "run", "requests")
    assert req.height >= 8 and (req["status"] == "ok").all(), req.filter(req["status"] != "ok")
    assert (req["output_tokens_reported"] == req["server_decode_tokens"]).all()  # usage and timings agree
    assert (req["output_tokens_reported"] == req["max_tokens"]).all()  # forced lengths hold
    out = summary["crosscheck"]["output_tokens"]
    assert out["counted_over_reported"] == 0 and out["counted"] + out["unseen"] == out["reported"]
    assert out["unseen_share"] < 0.1, out  # held-back byte tokens only
    timings = summary["crosscheck"]["server_timings"]
    assert timings["requests"] == summary["crosscheck"]["output_tokens"]["checked"] >= 5  # the window's requests
    assert timings["ttft_below_server_prompt"] == 0
    # llama.cpp's generation clock starts when the prompt is evaluated, the client's at the first chunk,
    # one decode step later: the client's span is shorter by up to a step, never longer than the
    # server's by more than the network's share
    decode = timings["decode_minus_server_ms"]
    assert decode["max"] < DECODE_BOUND_MS
    assert decode["p50"] > -summary["itl_s"]["p99"] * 1e3 - DECODE_BOUND_MS
    assert summary["split"]["source"].startswith("server_metrics:llamacpp")
    assert summary["split"]["prefill_s"] > 0 and summary["split"]["decode_s"] > 0


def test_the_context_length_comes_from_llamacpp_meta_n_ctx(tmp_path: Path) -> None:
    """Without --kv-unified each of the -np slots gets -c / -np tokens, and /v1/models says so in
    meta.n_ctx: a run must plan its prompts against that, not against the model's n_ctx_train."""
    from itlbench.harness.connect import connect

    gguf = export_gguf("cpu-small", tmp_path / "cpu-small.gguf").path
    cfg = LlamaCppConfig(model_path=gguf, chunk_budget=512, n_parallel=4, ctx_size=8192, kv_unified=False,
                         log_path=tmp_path / "llama.log")
    with LlamaCppServer(cfg) as srv:
        run = RunConfig(endpoint=srv.base_url, model=srv.model, workload="chat-short", streams=2, duration_s=2.0,
                        out=tmp_path / "run")
        conn = connect(run, tmp_path)
        try:
            assert conn.max_model_len == 2048
            assert conn.doc["engine"]["max_model_len"] == 2048
            assert conn.doc["engine"]["owned_by"] == "llamacpp"  # the report names the engine from it
        finally:
            conn.close()
