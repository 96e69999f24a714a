"""The simulated engine behind the real HTTP server: paced by the virtual clock, measured like any engine."""

from __future__ import annotations

import gc
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.sim.roofline import GPUS, CostModel, StepShape, load_hardware

SCALE = 4.0
SIM = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None, max_model_len=32768,
                   sim_time_scale=SCALE)


@pytest.fixture(scope="module")
def sim_server() -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerConfig(engine=SIM, port=0)) as srv:
        yield srv


def stream_gaps(client: openai.OpenAI, prompt: list[int], max_tokens: int, out: list[float]) -> None:
    last = None
    stream = client.completions.create(model="llama-3.1-8b", prompt=prompt, max_tokens=max_tokens, stream=True,
                                       extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text is not None and last is not None:
            out.append(now - last)
        last = now


def post_long_prompt(base_url: str, length: int, max_tokens: int) -> dict:
    """Send the long prompt with `json.dumps` (2 ms), not the `openai` SDK: its request transform walks a
    16k-token list in pure Python for ~150 ms, holding the GIL of this process — which also runs the server
    under test — so the SDK itself stalled the decode streams the test measures."""
    body = json.dumps({"model": "llama-3.1-8b", "prompt": list(range(10, 10 + length)), "max_tokens": max_tokens,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base_url}/completions", data=body, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


def test_served_sim_stalls_decoders_for_an_unchunked_prefill(sim_server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=sim_server.base_url, api_key="unused", max_retries=0)
    info = json.loads(urllib.request.urlopen(f"{sim_server.base_url}/engine", timeout=5).read())
    assert info["device"] == "sim:h100" and info["dtype"] == "bfloat16"
    gaps: list[list[float]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=stream_gaps, args=(client, list(range(3 + i, 3 + i + 500)), 400, gaps[i]))
               for i in range(4)]
    for t in threads:
        t.start()
    while not all(gaps):  # every stream is decoding
        time.sleep(0.01)
    long = post_long_prompt(sim_server.base_url, 16384, max_tokens=2)
    for t in threads:
        t.join()
    assert long['usage']['prompt_tokens'] == 16384
    cm = CostModel.for_hardware(PRESETS["llama-3.1-8b"], GPUS["h100"])
    stall = cm.time(StepShape.prefill(16384) + StepShape.decode(4, 600), GPUS["h100"]).total_s / SCALE
    worst = [max(g) for g in gaps]
    assert min(worst) > 0.9 * stall  # every stream waited for the prefill step
    median = sorted(x for g in gaps for x in g)[len(gaps) * 200]
    assert median < stall / 5  # and otherwise streamed at decode-step pace
    steps = [json.loads(line) for line in urllib.request.urlopen(
        f"{sim_server.base_url}/steps?since=0&follow=0", timeout=5).read().splitlines()]
    big = max(steps, key=lambda s: s["prefill_tokens"])
    assert big["prefill_tokens"] == 16384
    shape = StepShape(big["prefill_tokens"] + big["decode_tokens"], big["num_sampled"], big["context_tokens"],
                      big["attention_pairs"], big["num_prefill_reqs"] + big["num_decode_reqs"])
    assert (big["end_ns"] - big["start_ns"]) / 1e9 == pytest.approx(cm.time(shape, GPUS["h100"]).total_s / SCALE,
                                                                    abs=1e-6)


def test_served_disaggregated_pools_keep_decoders_streaming() -> None:
    """The same load against prefill and decode on separate simulated GPUs: no stall, all tokens arrive."""
    cfg = SIM.with_(disaggregate=True, prefill_gpu="h200-seeds")  # the source documents' slower prefill: a wide margin
    # Server and client threads share this process, and late in a full test session its heap is large: a
    # 0.65 s gap was seen there, while alone the test's gaps stay under 0.1 s. The suspect (not yet proven)
    # is a full collection of that heap pausing every thread; freezing what exists now keeps such a pause
    # of the test process out of the gaps it measures.
    gc.collect()
    gc.freeze()
    try:
        _disaggregated_run(cfg)
    finally:
        gc.unfreeze()


def _disaggregated_run(cfg: EngineConfig) -> None:
    with BackgroundServer(ServerConfig(engine=cfg, port=0)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        info = json.loads(urllib.request.urlopen(f"{srv.base_url}/engine", timeout=5).read())
        assert info["device"] == "sim:h200-seeds->h100"
        gaps: list[list[float]] = [[] for _ in range(4)]
        threads = [threading.Thread(target=stream_gaps, args=(client, list(range(3 + i, 3 + i + 500)), 300, gaps[i]))
                   for i in range(4)]
        for t in threads:
            t.start()
        while not all(gaps):
            time.sleep(0.01)
        long = post_long_prompt(srv.base_url, 16384, max_tokens=3)
        for t in threads:
            t.join()
    assert long['usage']['completion_tokens'] == 3 and long['usage']['prompt_tokens'] == 16384
    assert [len(g) for g in gaps] == [299] * 4
    seeds = load_hardware("h200-seeds")
    prefill = CostModel.for_hardware(PRESETS["llama-3.1-8b"], seeds).time(StepShape.prefill(16384), seeds).total_s / SCALE
    assert max(max(g) for g in gaps) < prefill / 2  # decode steps never waited for the prefill
