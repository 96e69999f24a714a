"""Many concurrent streams against the command-line server (engine process) on loopback: every stream
follows the protocol, hung-up streams are aborted, and no KV block stays in use afterwards."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

from itlbench.core.engine_config import EngineConfig
from itlbench.harness.bundled_server import BundledServer
from itlbench.harness.http_json import request_json
from itlbench.testing.stream_burst import burst

STREAMS = 250  # the full 1,000-stream figure comes from benchmarks/soak.py --burst 1000
ENGINE = EngineConfig(model="tiny", device="cpu", chunk_budget=2048, max_num_seqs=128, kv_blocks=1024,
                      max_model_len=1024, seed=0, engine_process=True, torch_threads=1)


def _finished(srv: BundledServer) -> dict[str, float]:
    """Requests the server has finished, by reason (from /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"{srv.root_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {s.labels["finished_reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "itlbench_request_success_total"}


def test_many_concurrent_streams_hold(tmp_path):
    with BundledServer(ENGINE, tmp_path / "server.log") as srv:
        info = srv.engine_info
        assert info["serving"]["engine_process"] is True
        model, vocab = str(info["served_model_name"]), int(info["model"]["vocab_size"])
        for wave in range(2):  # the second wave reuses every block the first one freed
            result = asyncio.run(burst(srv.base_url, model, STREAMS, max_tokens=4, prompt_tokens=24, vocab=vocab,
                                       hang_up_every=10, seed=wave))
            assert result.ok, result.errors[:5]
            assert (result.completed, result.hung_up) == (STREAMS - STREAMS // 10, STREAMS // 10)
        # a hung-up stream asked for 256 tokens, so it ends as an abort, or as "length" when the server wrote
        # all 256 into the socket before the client (250 streams on the same cores) read its first event
        deadline = time.monotonic() + 60
        while sum((finished := _finished(srv)).values()) < 2 * STREAMS:
            assert time.monotonic() < deadline, finished
            time.sleep(0.1)
        assert finished.get("stop", 0) == 0 and finished.get("abort", 0) >= 1
        assert finished["length"] >= 2 * (STREAMS - STREAMS // 10)
        state = request_json(f"{srv.base_url}/engine")
        assert state["num_running"] == 0 and state["num_waiting"] == 0
        assert state["kv_free_blocks"] == state["kv_blocks"] and state["kv_usage"] == 0.0
        assert request_json(f"{srv.root_url}/health") == {"status": "ok"}
