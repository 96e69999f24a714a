"""OpenAI `stop` strings: the matcher (any split of the text gives the one-shot result), the request field,
and the served engine (thread and process layouts, and the simulator) through the `openai` SDK: the text ends
just before the string, finish_reason "stop", vLLM's stop_reason the string, the tokens up to the one that
completed it, the engine's request ended as a "stop" finish, streamed text equal to the non-streamed."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.core.engine_config import EngineConfig
from itlbench.core.tokenizer import ByteTokenizer
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.server.app import STATE
from itlbench.server.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS, ApiError, parse_chat, parse_completion
from itlbench.server.stop_strings import Fed, StopStringMatcher, StopStrings
from tests.support.server_http import metric, scrape

# ---- the matcher --------------------------------------------------------------------------------


def one_shot(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """The specification, written plainly: the response ends where the text first completes a stop string
    (the longest of those completed there), before it or, with include, after it."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text.endswith(s, 0, end)]
        if hits:
            stop = max(hits, key=len)
            return text[:end if include else end - len(stop)], stop
    return text, None


def held_back(seen: str, stops: list[str]) -> int:
    """Length of the longest tail of `seen` that is a proper prefix of a stop string."""
    return max(k for k in range(len(seen) + 1) if k == 0 or any(len(s) > k and s.startswith(seen[-k:]) for s in stops))


ALPHABET = "ab\né"
texts = st.text(alphabet=ALPHABET, max_size=40)
stop_sets = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4)


def split(seq, cuts: list[int]) -> list:
    """`seq` cut at `cuts` (those past its end at its end): the pieces, empty ones dropped."""
    points = sorted({min(c, len(seq)) for c in cuts} | {0, len(seq)})
    return [seq[a:b] for a, b in zip(points, points[1:], strict=False)]


@settings(max_examples=400, deadline=None)
@given(text=texts, stops=stop_sets, cuts=st.lists(st.integers(0, 40), max_size=12), include=st.booleans())
def test_any_split_of_the_text_gives_the_one_shot_result(text, stops, cuts, include):
    m = StopStringMatcher(stops, include)
    shown, seen = "", ""
    for piece in split(text, cuts):
        shown += m.push(piece)
        seen += piece
        if m.matched is not None:
            break
        # held back: exactly the text a stop string may still start in (nothing, with include)
        assert len(seen) - len(shown) == (0 if include else held_back(seen, stops))
        assert seen.startswith(shown)
    shown += m.flush()
    assert (shown, m.matched) == one_shot(text, stops, include)
    if m.matched is not None:  # the response has ended: nothing more comes out
        assert m.push(m.matched) == "" and m.flush() == ""


def test_the_earliest_completed_stop_wins_and_the_longest_of_those():
    m = StopStringMatcher(["abcd", "bc"])
    assert m.push("xabcd") == "xa" and m.matched == "bc"
    m = StopStringMatcher(["c", "bc"], include_in_output=True)
    assert m.push("abcd") == "abc" and m.matched == "bc"


def test_text_is_held_back_only_while_it_may_start_a_stop_string():
    m = StopStringMatcher(["\n\nUser:"])
    assert m.push("Hi.\n") == "Hi."
    assert m.push("\nUs") == ""
    assert m.push("a") == "\n\nUsa"  # decided: not the stop string
    assert m.push("\n\nUser") == ""
    assert m.push(":x") == "" and m.matched == "\n\nUser:"


def test_unchecked_text_is_shown_and_never_starts_a_match():
    """min_tokens: no stop string is looked for in (or starting in) the text of the first tokens."""
    m = StopStringMatcher(["ab"])
    assert m.push("xa", check=False) == "xa"
    assert m.push("b") == "b" and m.matched is None  # this "ab" starts in unchecked text
    assert m.push("a") == "" and m.push("b") == "" and m.matched == "ab"


def test_empty_stop_strings_are_refused():
    with pytest.raises(ValueError):
        StopStringMatcher([])
    with pytest.raises(ValueError):
        StopStringMatcher(["x", ""])


# ---- token by token through the detokenizer ------------------------------------------------------

TOKENIZER = ByteTokenizer(512)


def test_a_stop_string_split_inside_a_character_ends_at_the_token_completing_it():
    ids = TOKENIZER.encode("ab€cd")  # € is three bytes, three tokens
    stops = StopStrings(TOKENIZER, ["€"], include_in_output=False)
    pieces = [stops.feed([t]) for t in ids]
    assert [p.text for p in pieces[:5]] == ["a", "b", "", "", ""]  # never half a character
    assert pieces[4].matched == "€" and pieces[4].num_tokens == 1 and stops.num_tokens == 5
    assert pieces[5] == pieces[6] == Fed("", 0)  # after the match: nothing


def test_min_tokens_keeps_the_first_tokens_text():
    stops = StopStrings(TOKENIZER, ["a"], include_in_output=False, min_tokens=2)
    fed = stops.feed(TOKENIZER.encode("aaab"))
    assert (fed.text, fed.num_tokens, fed.matched) == ("aa", 3, "a")


@settings(max_examples=200, deadline=None)
@given(text=texts, stops=stop_sets, cuts=st.lists(st.integers(0, 60), max_size=10), include=st.booleans())
def test_fed_in_any_chunks_the_text_and_token_count_are_the_one_shot_ones(text, stops, cuts, include):
    ids = TOKENIZER.encode(text)
    chunks = split(ids, cuts) or [[]]
    s = StopStrings(TOKENIZER, stops, include)
    shown, kept = "", 0
    for i, chunk in enumerate(chunks):
        fed = s.feed(chunk, final=i == len(chunks) - 1)
        shown += fed.text
        kept += fed.num_tokens
        if fed.matched:
            break
    assert (shown, s.matched) == one_shot(text, stops, include)
    if s.matched is None:
        assert kept == len(ids)
    else:  # the token that completed the match is the last one kept
        assert one_shot(TOKENIZER.decode(ids[:kept]), stops, include)[1] is not None
        assert one_shot(TOKENIZER.decode(ids[:kept - 1]), stops, include)[1] is None


# ---- the request field -------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (None, ()), ("", ()), ([], ()), ("\n", ("\n",)), (["a", "bc"], ("a", "bc")),
    (["x"] * MAX_STOP_STRINGS, ("x",) * MAX_STOP_STRINGS), ("y" * MAX_STOP_CHARS, ("y" * MAX_STOP_CHARS,)),
])
def test_stop_accepts_a_string_or_a_list_of_strings(value, expected):
    assert parse_completion({"prompt": "x", "stop": value}).stop == expected
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "stop": value}).stop == expected


@pytest.mark.parametrize("value, says", [
    (7, "a string or a list of strings"), (["a", 1], "a string or a list of strings"),
    ({"a": 1}, "a string or a list of strings"), ([["a"]], "a string or a list of strings"),
    (["a", ""], "stop[1] is an empty string"), (["x"] * (MAX_STOP_STRINGS + 1), f"at most {MAX_STOP_STRINGS}"),
    (["z" * (MAX_STOP_CHARS + 1)], f"at most {MAX_STOP_CHARS}"),
])
def test_a_bad_stop_is_refused_naming_it(value, says):
    with pytest.raises(ApiError) as info:
        parse_completion({"prompt": "x", "stop": value})
    assert info.value.status == 400 and info.value.param == "stop"
    assert info.value.message.startswith("stop: ") and says in info.value.message and "\n" not in info.value.message


# ---- served: the engine on a thread and in its own process (the `server` fixture) -----------------

PROMPT = "Once upon a time"
GREEDY = {"model": "tiny", "temperature": 0, "seed": 7, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def pick_stop(text: str, length: int = 3) -> tuple[str, int]:
    """A stop string from the middle of `text` (whole characters: no U+FFFD, which stands for a byte the
    tiny model's byte tokens left incomplete), and where it first occurs there (> 0)."""
    for i in range(len(text) // 3, len(text) - length):
        stop = text[i:i + length]
        if "\ufffd" not in stop and text.find(stop) > 0:
            return stop, text.find(stop)
    raise AssertionError(f"no stop string to take from {text!r}")


def ids_of(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def kept_tokens(decode, ids: list[int], stop: str) -> int:
    """How many tokens a response keeps: up to the one whose text completes `stop`."""
    return next(n for n in range(1, len(ids) + 1) if stop in decode(ids[:n]))


def completion_reference(client, max_tokens: int = 24):
    r = client.completions.create(prompt=PROMPT, max_tokens=max_tokens, **GREEDY)
    return r.choices[0].text, ids_of(r.choices[0])


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_ends_a_completion_streamed_or_not(server, client, include):
    decode = server.server.engine.engine.tokenizer.decode
    text, ids = completion_reference(client)
    stop, at = pick_stop(text)
    n = kept_tokens(decode, ids, stop)
    extra = {**GREEDY["extra_body"], "include_stop_str_in_output": include}
    args = {**GREEDY, "prompt": PROMPT, "max_tokens": 24, "stop": [stop, "never-seen-here"], "extra_body": extra}
    r = client.completions.create(**args)
    c = r.choices[0]
    assert c.text == text[:at + len(stop) if include else at] and c.finish_reason == "stop"
    assert c.model_extra["stop_reason"] == stop
    assert ids_of(c) == ids[:n] and r.usage.completion_tokens == n < len(ids)
    chunks = [ch for ch in client.completions.create(**args, stream=True, stream_options={"include_usage": True})]
    choices = [ch.choices[0] for ch in chunks if ch.choices]
    assert "".join(ch.text for ch in choices) == c.text
    assert [t for ch in choices for t in ids_of(ch)] == ids[:n]
    assert choices[-1].finish_reason == "stop" and choices[-1].model_extra["stop_reason"] == stop
    assert all(ch.finish_reason is None for ch in choices[:-1]) and chunks[-1].usage.completion_tokens == n


def test_a_stop_string_ends_a_chat_streamed_or_not(client):
    messages = [{"role": "user", "content": "Tell me a story."}]
    ref = client.chat.completions.create(messages=messages, max_tokens=24, **GREEDY)
    text = ref.choices[0].message.content
    stop, at = pick_stop(text)
    args = {**GREEDY, "messages": messages, "max_tokens": 24, "stop": stop}  # a bare string, not a list
    r = client.chat.completions.create(**args)
    assert r.choices[0].message.content == text[:at] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    assert r.usage.completion_tokens < ref.usage.completion_tokens
    chunks = [ch for ch in client.chat.completions.create(**args, stream=True) if ch.choices]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == text[:at]
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].model_extra["stop_reason"] == stop


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_engine_stops_and_records_a_stop_finish(server, client):
    """The request ends in the engine (KV freed) well before max_tokens, and metrics count it as a "stop"
    finish with the response's tokens, also where the engine finished it first: with max_tokens = n the
    match completes on the last token, which the engine ends as "length"."""
    decode = server.server.engine.engine.tokenizer.decode
    text, ids = completion_reference(client)
    stop, _ = pick_stop(text)
    n = kept_tokens(decode, ids, stop)
    max_tokens = 300
    state = server.server.runner.app[STATE]
    before = scrape(server)
    for stream, limit in ((False, max_tokens), (True, max_tokens), (False, n), (True, n)):
        r = client.completions.create(prompt=PROMPT, max_tokens=limit, stop=stop, stream=stream, **GREEDY)
        last = list(r)[-1].choices[0] if stream else r.choices[0]
        assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == stop
    name = "itlbench_request_success_total"
    wait_for(lambda: metric(scrape(server), name, finished_reason="stop") - metric(before, name, finished_reason="stop") == 4)
    after = scrape(server)
    for reason, moved in (("stop", 4), ("length", 0), ("abort", 0)):
        assert metric(after, name, finished_reason=reason) - metric(before, name, finished_reason=reason) == moved
    hist = "itlbench_request_generation_tokens_sum"
    assert metric(after, hist) - metric(before, hist) == 4 * n  # the tokens the responses kept
    generated = metric(after, "itlbench_generation_tokens_total") - metric(before, "itlbench_generation_tokens_total")
    assert 4 * n <= generated < 2 * max_tokens  # the engine stopped (a step or more after the match)
    engine = state.engine.engine
    wait_for(lambda: engine.num_running == 0 and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks)
    assert state.metrics.num_held == 0


def test_a_bad_stop_is_a_400_naming_it(client):
    for stop in ([""], ["x"] * (MAX_STOP_STRINGS + 1)):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="tiny", prompt="x", max_tokens=2, stop=stop)
        assert info.value.status_code == 400 and info.value.body["param"] == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={"stop": [3]})
    assert info.value.body["param"] == "stop" and "list of strings" in info.value.body["message"]


# ---- served: the simulator ---------------------------------------------------------------------

SIM = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=2048, sim_time_scale=500.0)


@pytest.fixture(scope="module")
def sim() -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerConfig(engine=SIM, port=0)) as srv:
        yield srv


def test_the_simulator_stops_at_a_stop_string_too(sim):
    client = openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0)
    args = {"model": "llama-3.1-8b", "prompt": "Write a poem.", "max_tokens": 40, "temperature": 0}
    ref = client.completions.create(**args)
    text = ref.choices[0].text
    stop, at = pick_stop(text, 4)
    r = client.completions.create(**args, stop=[stop])
    assert r.choices[0].text == text[:at] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop and r.usage.completion_tokens < ref.usage.completion_tokens
    streamed = [ch.choices[0] for ch in client.completions.create(**args, stop=[stop], stream=True) if ch.choices]
    assert "".join(ch.text for ch in streamed) == text[:at] and streamed[-1].finish_reason == "stop"
    body = urllib.request.urlopen(f"{sim.url}/metrics", timeout=5).read().decode()
    assert 'itlbench_request_success_total{finished_reason="abort",model_name="llama-3.1-8b"} 0.0' in body


# ---- the request's span --------------------------------------------------------------------------


def test_the_span_of_a_stop_string_response_says_stop_whatever_the_engine_said():
    from types import SimpleNamespace

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
    from opentelemetry.trace import StatusCode

    from itlbench.core.request import RequestOutput
    from itlbench.server.tracing import ServerTracing
    from itlbench.telemetry.otel import OtelProviders

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing = ServerTracing("unused", "tiny", providers=OtelProviders("unused", tracer_provider, MeterProvider()))
    http = SimpleNamespace(url=SimpleNamespace(host="127.0.0.1", port=1), headers={})
    req = parse_completion({"prompt": "x", "stop": "y", "max_tokens": 8})
    with tracing.begin(http, req, "cmpl-1", time.perf_counter_ns(), 1, 8) as span:
        # the engine ran on to max_tokens before the front end saw the match on token 3
        tracing.on_outputs([RequestOutput("cmpl-1", (5,), True, "length", 1, 8, 0, time.perf_counter_ns())], {})
        span.verdict = ("stop", 3)
    (done,) = spans.get_finished_spans()
    assert done.attributes[ga.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert done.attributes[ga.GEN_AI_USAGE_OUTPUT_TOKENS] == 3 and done.status.status_code != StatusCode.ERROR
