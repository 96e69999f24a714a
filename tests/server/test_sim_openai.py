"""The served simulator through the `openai` SDK: tokens as deterministic as a model's (seed, temperature 0), an
open-ended chat that ends, stop tokens whose text is left out (as vLLM does), and the OpenAI parameters it does not
implement refused by name unless they hold their no-op value."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import Request, SamplingParams
from itlbench.core.tokenizer import load_tokenizer
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.server.app import _stop_token
from itlbench.server.main import _log_startup
from itlbench.server.protocol import ApiError, parse_chat, parse_completion
from itlbench.sim.runner import SimTokens

MODEL = "llama-3.1-8b"
CONTEXT = 2048
SIM = EngineConfig(model=MODEL, engine="sim", gpu="h100", max_model_len=CONTEXT, sim_time_scale=500.0)
EOS = PRESETS[MODEL].eos_token_ids
TOKENIZER = load_tokenizer(PRESETS[MODEL])


@pytest.fixture(scope="module")
def sim() -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerConfig(engine=SIM, port=0)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(sim: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0)


def text(client: openai.OpenAI, prompt: str = "Hi", max_tokens: int = 6, **kw) -> str:
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **kw).choices[0].text


def streamed(client: openai.OpenAI, **kw) -> tuple[str, list[int], list]:
    chunks = [c for c in client.completions.create(model=MODEL, stream=True, **kw) if c.choices]
    return ("".join(c.choices[0].text for c in chunks), [t for c in chunks for t in c.choices[0].token_ids], chunks)


def test_a_seed_repeats_the_sims_text_and_another_seed_changes_it(client):
    first = text(client, seed=3)
    assert text(client, seed=3) == first  # before: two different texts for the same seed
    assert streamed(client, prompt="Hi", max_tokens=6, seed=3)[0] == first
    assert len({first, text(client, seed=4), text(client, seed=5)}) == 3
    assert len({text(client), text(client)}) == 2  # unseeded sampling still samples


def test_greedy_sim_text_is_a_function_of_the_prompt(client):
    greedy = text(client, temperature=0)
    assert text(client, temperature=0) == greedy  # before: different each time
    assert text(client, temperature=0, seed=9) == greedy  # greedy ignores the seed, as vLLM does
    assert text(client, prompt="Hello", temperature=0) != greedy
    steps = [text(client, prompt="Hi", temperature=0, max_tokens=n) for n in (2, 4)]
    assert greedy.startswith(steps[0]) and greedy.startswith(steps[1])  # each token depends on what came before only


def test_an_open_ended_sim_chat_ends_with_eos_at_a_plausible_seeded_length(client):
    messages = [{"role": "user", "content": "Tell me a story"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, seed=7)
    n = r.usage.completion_tokens
    prompt = r.usage.prompt_tokens
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason is None  # EOS, not a stop id
    assert 1 <= n < CONTEXT - prompt  # before: the whole context (53k tokens on a 128k model)
    assert r.choices[0].token_ids[-1] in EOS and len(r.choices[0].token_ids) == n
    again = client.chat.completions.create(model=MODEL, messages=messages, seed=7)
    assert again.choices[0].message.content == r.choices[0].message.content
    lengths = {client.chat.completions.create(model=MODEL, messages=messages, seed=s).usage.completion_tokens
               for s in (1, 2, 3)}
    assert len(lengths | {n}) > 1  # a distribution, not one length
    # what a benchmark sends keeps its length: max_tokens, or ignore_eos
    fixed = client.chat.completions.create(model=MODEL, messages=messages, seed=7, max_tokens=n + 50)
    assert fixed.choices[0].finish_reason == "length" and fixed.usage.completion_tokens == n + 50
    full = client.chat.completions.create(model=MODEL, messages=messages, seed=7, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == CONTEXT - prompt


def test_a_stop_tokens_text_is_left_out_as_vllm_does(client):
    ids = client.completions.create(model=MODEL, prompt="Hi", max_tokens=8, temperature=0).choices[0].token_ids
    k = next(i for i in range(2, 8) if ids[i] not in ids[:i])
    stop = {"stop_token_ids": [ids[k]]}
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=8, temperature=0, extra_body=stop)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == ids[k]
    assert choice.token_ids == ids[:k + 1] and r.usage.completion_tokens == k + 1  # the id stays, counted
    assert choice.text == TOKENIZER.decode(ids[:k])  # before: its text too
    assert TOKENIZER.decode(ids[:k + 1]) != choice.text
    text_, token_ids, chunks = streamed(client, prompt="Hi", max_tokens=8, temperature=0, extra_body=stop)
    assert text_ == choice.text and token_ids == ids[:k + 1]
    last = chunks[-1].choices[0]
    assert last.token_ids == [ids[k]] and last.text == "" and last.finish_reason == "stop"
    assert last.stop_reason == ids[k]
    kept = client.completions.create(model=MODEL, prompt="Hi", max_tokens=8, temperature=0,
                                     extra_body={**stop, "include_stop_str_in_output": True})
    assert kept.choices[0].text == TOKENIZER.decode(ids[:k + 1])


def test_stop_token_helper_leaves_out_eos_and_stop_ids_only():
    class Engine:
        class model_config:  # noqa: N801 - stands for the engine's model config
            eos_token_ids = frozenset({2})

    req = parse_completion({"prompt": "x", "stop_token_ids": [7]})
    assert _stop_token(req, [5, 7], "stop", Engine) == ([5], 7)
    assert _stop_token(req, [5, 2], "stop", Engine) == ([5], None)  # EOS: left out, no stop_reason
    assert _stop_token(req, [5, 7], "length", Engine) == ([5, 7], None)
    kept = parse_completion({"prompt": "x", "stop_token_ids": [7], "include_stop_str_in_output": True})
    assert _stop_token(kept, [5, 7], "stop", Engine) == ([5, 7], 7)


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            stream=True, stream_options={"include_usage": True,
                                                                         "continuous_usage_stats": True})
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)  # before: usage on the last chunk only
    assert [c.usage.completion_tokens for c in chunks if c.choices] == [0, 1, 2, 3, 4, 5]


UNSUPPORTED = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"extra_body": {"top_k": 5}}, "top_k"),
    ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
]
NEUTRAL = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "presence_penalty": 0,
           "frequency_penalty": 0, "logit_bias": {},
           "extra_body": {"top_k": -1, "min_p": 0, "repetition_penalty": 1}}


@pytest.mark.parametrize(("kw", "param"), UNSUPPORTED)
def test_an_unsupported_parameter_is_a_400_naming_it(client, kw, param):
    with pytest.raises(openai.BadRequestError) as info:  # before: 200, the field silently ignored
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **kw)
    err = info.value.body
    assert err["param"] == param and err["message"].startswith(f"{param}: ")


def test_the_no_op_values_sdks_send_are_accepted(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       **NEUTRAL)
    assert r.usage.completion_tokens == 2
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, suffix="").usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, suffix="end")


def test_unsupported_parameters_are_refused_by_both_parsers():
    for body, param in (({"suffix": "x"}, "suffix"), ({"prompt_logprobs": 1}, "prompt_logprobs"),
                        ({"min_p": 0.1}, "min_p"), ({"use_beam_search": True}, "use_beam_search"),
                        ({"logprobs": 0}, "logprobs"), ({"logprobs": 2}, "logprobs")):  # 0: the sampled token's
        with pytest.raises(ApiError) as info:
            parse_completion({"prompt": "x", **body})
        assert info.value.param == param
    with pytest.raises(ApiError) as info:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2})
    assert info.value.param == "presence_penalty"
    with pytest.raises(ApiError, match="presence_penalty: must be a number"):
        parse_chat({"messages": [{"role": "user", "content": "x"}], "presence_penalty": "high"})
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "presence_penalty": None,
                       "tools": None, "function_call": "auto", "logprobs": False}).chat
    assert parse_completion({"prompt": "x", "logprobs": None}).max_tokens


def test_the_sims_greedy_tokens_skip_eos_and_ignore_the_engines_seed():
    tokens = SimTokens(vocab=5, stop_ids=(2,), seed=0)
    req = Request("a", [1, 3, 4], SamplingParams(max_tokens=40, temperature=0.0))
    for _ in range(40):
        req.output_token_ids.append(tokens.next(req))
    assert 2 not in req.output_token_ids and len(set(req.output_token_ids)) == 4  # EOS, drawn by chance, is skipped
    again = Request("a", [1, 3, 4], SamplingParams(max_tokens=40, temperature=0.0))  # the same id, a new request
    fresh = SimTokens(vocab=5, stop_ids=(2,), seed=1)
    for _ in range(40):
        again.output_token_ids.append(fresh.next(again))
    assert again.output_token_ids == req.output_token_ids  # the engine's --seed does not enter greedy tokens
    open_ended = Request("b", [1, 3, 4], SamplingParams(max_tokens=5000, min_tokens=900, open_ended=True))
    while not open_ended.output_token_ids or open_ended.output_token_ids[-1] != 2:
        open_ended.output_token_ids.append(tokens.next(open_ended))
    assert len(open_ended.output_token_ids) >= 900  # its EOS comes no sooner than min_tokens


def test_sim_layout_and_log_say_what_runs(sim: BackgroundServer, caplog: pytest.LogCaptureFixture):
    with urllib.request.urlopen(f"{sim.base_url}/engine", timeout=10) as resp:
        serving = json.loads(resp.read())["serving"]
    assert serving["engine_process"] is False and serving["torch_threads"] is None  # before: torch's count
    with caplog.at_level(logging.INFO, logger="itlbench.server"):
        _log_startup(sim.server, sim.server.engine.engine, serving)  # type: ignore[union-attr]
    assert "simulated on a thread of the server (no engine process, no torch)" in caplog.text
    assert "torch_threads" not in caplog.text


def test_serve_refuses_engine_process_flags_for_the_sim():
    for flags in (["--engine-process"], ["--torch-threads", "2"]):
        # --max-body-mib 0 is refused later on: whatever happens, nothing starts serving
        result = CliRunner().invoke(app, ["serve", "--engine", "sim", "--model", MODEL, "--port", "0",
                                          "--max-body-mib", "0", *flags])
        assert result.exit_code != 0 and f"{flags[0]}: does not apply to --engine sim" in result.output
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "300"}).output
    assert "engine flags above" not in help_text and "listed below" in help_text
