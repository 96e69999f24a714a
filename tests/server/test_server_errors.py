"""Bad input, auth, capacity and engine failures: each answers its status and the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from itlbench.server import BackgroundServer, ServerConfig
from tests.support.servers import TINY_ENGINE as ENGINE


def post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


OK = {"prompt": "fine", "max_tokens": 3}
BAD_COMPLETIONS = [
    (b"{not json", "body"),
    ({"prompt": 123, "max_tokens": 3}, "prompt"),
    ({"prompt": "", "max_tokens": 3}, "prompt"),
    ({"prompt": ["a", "b"], "max_tokens": 3}, "prompt"),
    ({"prompt": [1, 2, 100000], "max_tokens": 3}, "prompt"),
    ({"prompt": "x", "max_tokens": "3"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": -5}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x" * 1000, "max_tokens": 100}, "max_tokens"),
    ({"prompt": "x" * 1100, "max_tokens": 1}, "prompt"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": 3, "min_tokens": 5}, "min_tokens"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "seed": 2**64}, "seed"),  # drew exactly what seed 0 draws
    ({"prompt": "x", "seed": -(2**63) - 1}, "seed"),
    ({"prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "\ud800", "max_tokens": 2}, "prompt"),  # a lone surrogate: valid JSON, not text
    ({"prompt": "\ud800", "max_tokens": 2, "stream": True}, "prompt"),
    (b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body"),  # was a 500 RecursionError
]
BAD_CHAT = [
    ({"max_tokens": 3}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "\ud800", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),  # was named "logprobs"
]


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS)
def test_bad_completion_is_400_naming_the_field(server, body, param):
    status, err = post(f"{server.base_url}/completions", body)
    assert status == 400, err
    assert err["error"]["param"] == param and param in err["error"]["message"]
    assert err["error"]["type"] == "invalid_request_error"
    assert post(f"{server.base_url}/completions", OK)[0] == 200


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
def test_bad_chat_is_400_naming_the_field(server, body, param):
    status, err = post(f"{server.base_url}/chat/completions", body)
    assert status == 400, err
    assert err["error"]["param"] == param and param in err["error"]["message"]


def test_a_deep_but_parseable_body_is_walked_without_recursion(server):
    """900 nested objects parse, but the lone-surrogate check recursed through them: a 500 RecursionError."""
    deep = b'{"a": ' * 900 + b'"\\ud800"' + b"}" * 900
    status, err = post(f"{server.base_url}/completions", b'{"prompt": "x", "max_tokens": 2, "extra": ' + deep + b"}")
    assert status == 400 and err["error"]["param"] == "extra" + ".a" * 900
    status, _ = post(f"{server.base_url}/completions", b'{"prompt": "x", "max_tokens": 2, "extra": [' + deep + b"]}")
    assert status == 400
    assert post(f"{server.base_url}/completions", b'{"prompt": "x", "max_tokens": 2, "extra": ' +
                deep.replace(b"\\ud800", b"ok") + b"}")[0] == 200


def test_a_context_overflow_says_so_as_openai_does(server):
    """code context_length_exceeded and "maximum context length", which wrappers (LiteLLM, LangChain) look for to
    truncate or fall back; the code was null and the words absent."""
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    too_long = [{"role": "user", "content": "x" * ENGINE.max_model_len}]
    fits = [{"role": "user", "content": "x"}]
    for messages, max_tokens, param in ((too_long, None, "messages"), (fits, 5000, "max_tokens")):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens)
        assert info.value.code == "context_length_exceeded" and info.value.param == param
        assert "maximum context length is 1024 tokens" in info.value.message


def test_the_64_bit_seeds_at_both_ends_are_served(server):
    for seed in (2**63 - 1, -(2**63)):
        assert post(f"{server.base_url}/completions", {**OK, "seed": seed})[0] == 200


def test_unknown_model_is_404(server):
    status, err = post(f"{server.base_url}/completions", {**OK, "model": "gpt-9"})
    assert status == 404 and err["error"]["param"] == "model" and "gpt-9" in err["error"]["message"]
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens >= 1


def test_get_one_model_returns_the_model_object(server):
    """GET /v1/models/{model} answers the served model's object (as OpenAI does), 404 for another name."""
    with urllib.request.urlopen(f"{server.base_url}/models/tiny", timeout=30) as resp:
        model = json.loads(resp.read())
    assert model["id"] == "tiny" and model["object"] == "model"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{server.base_url}/models/gpt-9", timeout=30)
    assert info.value.code == 404 and json.loads(info.value.read())["error"]["param"] == "model"


def test_a_wrong_method_is_405_saying_which_it_takes(server):
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{server.base_url}/chat/completions", timeout=30)
    assert info.value.code == 405 and info.value.headers["Allow"] == "POST"  # the header was dropped
    assert json.loads(info.value.read())["error"]["type"] == "invalid_request_error"


def test_sdk_sees_bad_request(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert "max_tokens" in str(info.value)


def test_a_body_over_the_limit_is_413_naming_the_limit(server):
    """4 MiB by default: a 128k-token prompt of ids fits, a 5 MiB body does not (and the server lives on)."""
    ids = list(range(1, 500)) * 263  # 131,237 token ids, about 0.5 MiB of JSON: a long prompt still fits
    status, err = post(f"{server.base_url}/completions", {"prompt": ids, "max_tokens": 1})
    assert status == 400 and err["error"]["param"] == "prompt"  # refused for its length, not its size
    status, err = post(f"{server.base_url}/completions", {"prompt": "x" * (5 << 20), "max_tokens": 1})
    assert status == 413 and err["error"]["param"] == "body" and "4 MiB" in err["error"]["message"]
    assert post(f"{server.base_url}/completions", OK)[0] == 200


@pytest.fixture(scope="module")
def guarded():
    """A second server with an API key and no waiting room: every admitted request is over capacity; its model
    name has a slash, as a Hugging Face repo's has."""
    cfg = ServerConfig(engine=ENGINE, port=0, api_key="sekret", max_waiting=0, served_model_name="org/bench")
    with BackgroundServer(cfg) as srv:
        yield srv


def test_api_key_is_required(guarded):
    status, err = post(f"{guarded.base_url}/completions", OK)
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    status, _ = post(f"{guarded.base_url}/completions", OK, {"Authorization": "Bearer wrong"})
    assert status == 401
    client = openai.OpenAI(base_url=guarded.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    good = openai.OpenAI(base_url=guarded.base_url, api_key="sekret", max_retries=0)
    assert [m.id for m in good.models.list().data] == ["org/bench"]


def test_a_model_name_with_a_slash_is_found_by_its_path(guarded):
    """GET /v1/models/org/bench, the slash as typed (curl, a browser): was a bare 404 "Not Found"."""
    req = urllib.request.Request(f"{guarded.base_url}/models/org/bench", headers={"Authorization": "Bearer sekret"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.loads(resp.read())["id"] == "org/bench"
    client = openai.OpenAI(base_url=guarded.base_url, api_key="sekret", max_retries=0)
    assert client.models.retrieve("org/bench").id == "org/bench"


def test_over_capacity_is_429(guarded):
    client = openai.OpenAI(base_url=guarded.base_url, api_key="sekret", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="org/bench", prompt="x", max_tokens=2)


def test_engine_step_failure_fails_request_and_recovers(guarded):
    driver = guarded.server.engine
    driver.max_waiting = None
    engine = driver.engine
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = flaky_step
    try:
        auth = {"Authorization": "Bearer sekret"}
        status, err = post(f"{guarded.base_url}/completions", {**OK, "max_tokens": 5, "ignore_eos": True}, auth)
        assert status == 500 and "injected fault" in err["error"]["message"]
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        status, body = post(f"{guarded.base_url}/completions", {**OK, "ignore_eos": True}, auth)
        assert status == 200 and body["usage"]["completion_tokens"] == 3
        with urllib.request.urlopen(f"{guarded.url}/health", timeout=5) as resp:
            assert resp.status == 200
    finally:
        engine.step = real_step
        driver.max_waiting = 0


def test_a_refused_value_tells_the_client_its_fix(server):
    """The fix a ConfigError carries reached the terminal but not the API client, who sent the request."""
    status, err = post(f"{server.base_url}/completions", {"prompt": [1, 2, 100000], "max_tokens": 3})
    vocab = ENGINE.model_config().vocab_size if hasattr(ENGINE, "model_config") else None
    assert status == 400 and "is outside the vocabulary" in err["error"]["message"]
    assert "(send ids below " in err["error"]["message"], err
    if vocab is not None:
        assert f"(send ids below {vocab})" in err["error"]["message"]
