"""The bundled server on loopback, driven by the official `openai` SDK and raw aiohttp/httpx clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time

import aiohttp
import openai
import pytest

from itlbench.core.request import SamplingParams
from itlbench.serving.build import create_engine
from tests.support.server_http import http, metric, scrape
from tests.support.servers import TINY_ENGINE as ENGINE


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def wait_idle(server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = http(f"{server.base_url}/engine").json()
        if info["num_running"] == 0 and info["num_waiting"] == 0:
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def wait_metric(server, value: float, name: str, **labels: str) -> None:
    deadline = time.monotonic() + 20
    while metric(scrape(server), name, **labels) < value:
        assert time.monotonic() < deadline, (name, labels, value)
        time.sleep(0.05)


def token_ids(choice) -> list[int]:
    return list(choice.model_extra["token_ids"])


def test_completion_non_streaming(client):
    r = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=7,
                                  extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion" and r.model == "tiny"
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert len(token_ids(choice)) == 7
    assert r.usage.prompt_tokens == len(b"The quick brown fox")
    assert r.usage.completion_tokens == 7 and r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_a_completions_default_max_tokens_is_cut_to_the_context_an_explicit_one_is_not(client):
    """OpenAI's default of 16 is the server's choice: a prompt 4 tokens short of the context got a 400 blaming
    "16 max_tokens", a field the client never sent; now it runs to the context's end (vLLM's behaviour)."""
    prompt = [5] * (ENGINE.max_model_len - 4)
    r = client.completions.create(model="tiny", prompt=prompt, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="use at most 4"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=16)


def test_completion_streaming_exact_length_and_usage(client):
    stream = client.completions.create(model="tiny", prompt=[5, 6, 7, 8, 9], max_tokens=12, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True, "min_tokens": 12})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    ids = [t for c in content for t in token_ids(c.choices[0])]
    assert len(ids) == 12
    assert all(len(token_ids(c.choices[0])) == 1 for c in content)  # one chunk per step
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 12 and usage.usage.prompt_tokens == 5


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == len(b"<|user|>\nhi\n<|assistant|>\n")


def test_developer_and_function_messages_are_accepted(client):
    """OpenAI's SDK sends "developer" (newer models' "system") and the deprecated "function"; both were a 400."""
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "function", "name": "f", "content": "1"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    rendered = "<|developer|>\nbe brief\n<|user|>\nhi\n<|function|>\n1\n<|assistant|>\n"
    assert r.usage.prompt_tokens == len(rendered.encode())


def test_every_generation_answer_names_its_request_in_x_request_id(client):
    """The SDKs' `request_id` (of a response, a stream, an error) reads x-request-id, which was absent: it is
    the response's id, the engine's request id that /v1/steps and the traces name."""
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                           max_tokens=2)
    assert raw.request_id == raw.parse().id and raw.request_id.startswith("chatcmpl-")
    with client.completions.with_streaming_response.create(model="tiny", prompt="hi", max_tokens=2,
                                                           stream=True) as resp:
        ids = {chunk.id for chunk in resp.parse()}
    assert ids == {resp.request_id} and resp.request_id.startswith("cmpl-")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", max_tokens=0)
    assert info.value.request_id.startswith("cmpl-")


def test_chat_streaming_role_first_then_content(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                                    {"role": "user", "content": "hello"}],
                                            max_tokens=6, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and not first.delta.content
    content = [c for c in chunks[1:] if c.choices]
    assert sum(len(token_ids(c.choices[0])) for c in content) == 6
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_greedy_stream_matches_direct_engine(client):
    prompt = [11, 42, 99, 7, 300, 123, 64, 5]
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    served = [t for c in stream for t in token_ids(c.choices[0])]
    reference = create_engine(ENGINE).generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert served == reference[0]


def test_a_stop_token_ends_the_response_without_its_text(server, client):
    """vLLM's stop_token_ids: the token is in token_ids and usage, its text is not (unless include_stop_str_in_output)."""
    prompt = [11, 42, 99, 7, 300, 123, 64, 5]
    greedy = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    decode = server.server.engine.engine.tokenizer.decode
    ids = token_ids(client.completions.create(**greedy, extra_body={"ignore_eos": True}).choices[0])
    k = next(i for i in range(1, 12) if ids[i] not in ids[:i] and decode([ids[i]]))
    stop = {"ignore_eos": True, "stop_token_ids": [ids[k]]}
    r = client.completions.create(**greedy, extra_body=stop)
    assert r.choices[0].finish_reason == "stop" and token_ids(r.choices[0]) == ids[:k + 1]
    assert r.choices[0].text == decode(ids[:k]) != decode(ids[:k + 1])  # before: the stop token's text too
    assert r.choices[0].model_extra["stop_reason"] == ids[k] and r.usage.completion_tokens == k + 1
    chunks = [c for c in client.completions.create(**greedy, stream=True, extra_body=stop) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == decode(ids[:k])
    assert chunks[-1].choices[0].text == "" and token_ids(chunks[-1].choices[0]) == [ids[k]]
    kept = client.completions.create(**greedy, extra_body={**stop, "include_stop_str_in_output": True})
    assert kept.choices[0].text == decode(ids[:k + 1])


def test_token_counters_move_by_tokens_served(server, client):
    before = scrape(server)
    served = 0
    for n in (3, 9):
        r = client.completions.create(model="tiny", prompt="count me", max_tokens=n, extra_body={"ignore_eos": True})
        served += r.usage.completion_tokens
    after = scrape(server)
    gen = metric(after, "itlbench_generation_tokens_total") - metric(before, "itlbench_generation_tokens_total")
    prompt = metric(after, "itlbench_prompt_tokens_total") - metric(before, "itlbench_prompt_tokens_total")
    assert gen == served == 12
    assert prompt == 2 * len(b"count me")
    ok = "itlbench_request_success_total"
    assert metric(after, ok, finished_reason="length") - metric(before, ok, finished_reason="length") == 2
    assert metric(after, "itlbench_time_to_first_token_seconds_count") >= 2
    assert metric(after, "itlbench_engine_config_info", chunk_budget="64", policy="budget", mixed="false",
                  max_num_seqs="64", block_size="16", kv_blocks="256", device="cpu", dtype="float32",
                  model="tiny") == 1.0


async def _stream_lines(url: str, body: dict, keep: int | None = None,
                        started: asyncio.Event | None = None) -> list[dict]:
    """Stream a completion; with `keep`, close the connection after that many data events."""
    events: list[dict] = []
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[6:]))
                if started is not None:
                    started.set()
                if keep is not None and len(events) >= keep:
                    break
    return events


def test_mixed_step_counted_in_phase_histograms(server):
    before = scrape(server)
    url = f"{server.base_url}/completions"
    long_decode = {"prompt": "a", "max_tokens": 900, "ignore_eos": True, "stream": True}
    newcomer = {"prompt": "x" * 150, "max_tokens": 2, "ignore_eos": True, "stream": True}

    async def scenario() -> None:
        decoding = asyncio.Event()
        decode = asyncio.create_task(_stream_lines(url, long_decode, started=decoding))
        await decoding.wait()
        await _stream_lines(url, newcomer)  # its prefill chunks share steps with the decode
        decode.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await decode

    aborts = metric(before, "itlbench_request_success_total", finished_reason="abort")
    asyncio.run(scenario())
    wait_metric(server, aborts + 1, "itlbench_request_success_total", finished_reason="abort")
    after = scrape(server)
    for phase in ("prefill", "decode", "mixed"):
        name = "itlbench_engine_step_duration_seconds_count"
        assert metric(after, name, phase=phase) > metric(before, name, phase=phase), phase
        steps = "itlbench_engine_steps_total"
        assert metric(after, steps, phase=phase) > metric(before, steps, phase=phase), phase
    assert metric(after, "itlbench_engine_step_budget_used_ratio_count") > 0
    assert metric(after, "itlbench_engine_step_prefill_tokens_sum") > metric(before, "itlbench_engine_step_prefill_tokens_sum")


def test_client_disconnect_frees_kv_blocks(server):
    url = f"{server.base_url}/completions"
    body = {"prompt": "y" * 100, "max_tokens": 800, "ignore_eos": True, "stream": True}
    aborts = metric(scrape(server), "itlbench_request_success_total", finished_reason="abort")
    events = asyncio.run(_stream_lines(url, body, keep=2))
    assert len(events) == 2
    wait_metric(server, aborts + 1, "itlbench_request_success_total", finished_reason="abort")
    info = wait_idle(server)
    assert info["kv_usage"] == 0.0 and info["kv_free_blocks"] == info["kv_blocks"]
    assert metric(scrape(server), "itlbench_request_success_total", finished_reason="abort") == aborts + 1
    assert http(f"{server.url}/health").status_code == 200


def _reset_after_first_token(server, body: dict) -> None:
    """Stream `body`, read up to the first token's chunk, then drop the connection with a TCP reset."""
    data = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        got = b""
        while b'"content"' not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_clients_leaving_mid_stream_are_no_server_errors(server, caplog):
    """A write can find the socket reset before aiohttp saw the close: that raised out of the handler, and
    aiohttp logged "Error handling request" with a traceback for about one stream in four so left."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    aborts = metric(scrape(server), "itlbench_request_success_total", finished_reason="abort")
    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        for _ in range(24):
            _reset_after_first_token(server, body)
        wait_metric(server, aborts + 24, "itlbench_request_success_total", finished_reason="abort")
        info = wait_idle(server)  # the handlers' aborts come before anything they log: all are done
    assert info["kv_free_blocks"] == info["kv_blocks"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_steps_endpoint_ndjson(server, client):
    last = http(f"{server.base_url}/engine").json()["last_step"]
    client.completions.create(model="tiny", prompt="steps", max_tokens=3, extra_body={"ignore_eos": True})
    resp = http(f"{server.base_url}/steps", params={"since": last + 1, "follow": 0})
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("application/x-ndjson")
    records = [json.loads(line) for line in resp.text.splitlines()]
    assert [r["step"] for r in records] == list(range(last + 1, last + 1 + len(records)))
    assert len(records) == 3 and records[0]["phase"] == "prefill"
    assert {"phase", "prefill_tokens", "decode_tokens", "start_ns", "end_ns", "kv_usage"} <= set(records[0])


def test_steps_follow_streams_live_records(server, client):
    since = http(f"{server.base_url}/engine").json()["last_step"] + 1

    async def follow() -> list[dict]:
        got: list[dict] = []
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.base_url}/steps", params={"since": since}) as resp:
                gen = asyncio.create_task(asyncio.to_thread(
                    client.completions.create, model="tiny", prompt="live", max_tokens=4,
                    extra_body={"ignore_eos": True}))
                async for line in resp.content:
                    got.append(json.loads(line))
                    if len(got) == 4:
                        break
                await gen
        return got

    records = asyncio.run(asyncio.wait_for(follow(), 20))
    assert [r["step"] for r in records] == list(range(since, since + 4))


def test_models_engine_and_health(server):
    models = http(f"{server.base_url}/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    info = http(f"{server.base_url}/engine").json()
    assert info["engine"]["chunk_budget"] == 64 and info["model"]["name"] == "tiny"
    assert info["device"] == "cpu" and info["max_model_len"] == 1024
    assert http(f"{server.url}/health").json() == {"status": "ok"}
