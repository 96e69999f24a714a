"""RunConfig's own checks and the run directory's default name (the README's `reports/<time>-rag-inj32k-b2048/`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.orchestrate import default_run_dir
from itlbench.harness.run_config import RunConfig, parse_extra_body

ENDPOINT = {"endpoint": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"warmup_s": -1.0}, "--warmup", "must be >= 0 seconds, got -1.0"),
    ({"request_timeout_s": 0.0}, "--request-timeout", "must be > 0 seconds, got 0.0"),
    ({"ramp_s": -0.5}, "--ramp", "must be >= 0 seconds, got -0.5"),
    ({"streams": 0}, "--streams", "sends nothing"),
    ({"prompt_format": "text"}, "--prompt-format", "always sent token-id prompts"),
    ({"api": "chat"}, "--api", "chat messages are text"),
    ({"scrape_interval_s": 5.0}, "--scrape-interval", "only an --endpoint's /metrics is scraped"),
    ({**ENDPOINT, "api": "soap"}, "--api", "unknown API 'soap'"),
    ({**ENDPOINT, "prompt_format": "yaml"}, "--prompt-format", "unknown format 'yaml'"),
    ({**ENDPOINT, "prompt_format": "ids", "api": "chat"}, "--prompt-format", "token-id prompts need the completions"),
    ({**ENDPOINT, "scrape_interval_s": -1.0}, "--scrape-interval", "must be >= 0 seconds, got -1.0"),
    ({"workers": 0}, "--workers", "must be >= 1, got 0"),
    ({"stream_reader": "telepathy"}, "--stream-reader", "unknown reader 'telepathy'"),
    ({"stall_factor": 1.0}, "--stall-factor", "must be > 1, got 1.0"),
    ({"stall_floor_s": -0.01}, "--stall-floor", "must be >= 0 seconds, got -0.01"),
    ({"endpoint": "ftp://host/v1", "model": "m"}, "--endpoint", "ftp://host/v1"),
])
def test_each_bad_value_is_refused_naming_its_flag(kwargs: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(**kwargs).validate()
    assert err.value.field == field and words in err.value.problem, str(err.value)
    assert "\n" not in str(err.value), "one line"


def test_a_trace_replay_refuses_a_time_scale_that_is_not_positive(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n")
    with pytest.raises(ConfigError) as err:
        RunConfig(workload="trace", trace=trace, time_scale=0.0).validate()
    assert err.value.field == "--time-scale" and "must be > 0, got 0.0" in err.value.problem
    RunConfig(workload="trace", trace=trace, time_scale=2.0).validate()  # a positive one is taken


@pytest.mark.parametrize(("text", "words"), [
    ("{", "is not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"max_tokens": 3, "prompt": "x"}', "sets max_tokens, prompt, which the workload decides"),
])
def test_extra_body_refuses_what_is_not_its_own(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_extra_body(text)
    assert err.value.field == "--extra-body" and words in err.value.problem


def test_extra_body_merges_a_json_object() -> None:
    assert parse_extra_body('{"logprobs": 1, "top_k": 5}') == {"logprobs": 1, "top_k": 5}
    assert parse_extra_body(None) == {} == parse_extra_body("")


def _name(cfg: RunConfig) -> str:
    path = default_run_dir(cfg)
    assert path.parent == cfg.reports_dir
    stamp, _, rest = path.name.partition("-")
    day, _, rest = rest.partition("-")
    when = dt.datetime.strptime(f"{stamp}-{day}", "%Y%m%d-%H%M%S").replace(tzinfo=dt.UTC)
    assert abs((dt.datetime.now(dt.UTC) - when).total_seconds()) < 60, "a UTC time stamp that sorts"
    return rest


def test_the_default_run_directory_says_workload_injection_and_budget(tmp_path: Path) -> None:
    budget = EngineConfig(chunk_budget=2048)
    assert _name(RunConfig(workload="rag", inject="32k", engine=budget, reports_dir=tmp_path)) == "rag-inj32k-b2048"
    assert _name(RunConfig(workload="chat", engine=EngineConfig(chunk_budget=None))) == "chat-unchunked"
    policy = EngineConfig(chunk_budget=512, policy="prefill-first", mixed=True)
    assert _name(RunConfig(workload="chat", inject="2x8k@10s,30s", engine=policy)) == \
        "chat-inj2x8k_10s_30s-b512-prefill-first-mixed"
    assert _name(RunConfig(workload="fixed:5000:500", **ENDPOINT)) == "fixed_5000_500-ext", "no budget of its own"
    assert _name(RunConfig(workload="code", inject="32k/30s")) == "code-inj32k_30s-b2048", "the default budget"


@pytest.mark.parametrize(("text", "words"), [
    ('{"temperature": NaN}', "NaN"),
    ('{"a": [Infinity]}', "Infinity"),
    ('{"a": -Infinity}', "-Infinity"),
    ('{"a": 1e400}', "1e400"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
], ids=["nan", "infinity", "-infinity", "1e400", "deep"])
def test_extra_body_refuses_what_no_json_encoder_can_send(text: str, words: str) -> None:
    # was: NaN/Infinity/1e400 passed, then the run died writing run.json (ValueError traceback, exit 1, a run
    # directory left behind); nesting past the parser's stack raised RecursionError
    with pytest.raises(ConfigError) as err:
        parse_extra_body(text)
    assert err.value.field == "--extra-body" and words in err.value.problem and "\n" not in str(err.value)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_no_generator_takes_is_refused_naming_the_flag(seed: int) -> None:
    # was: --seed -1 reached numpy's default_rng (ValueError: expected non-negative integer, a traceback); torch's
    # manual_seed overflows past 2**64 - 1
    with pytest.raises(ConfigError) as err:
        RunConfig(seed=seed).validate()
    assert err.value.field == "--seed" and str(seed) in err.value.problem and err.value.fix
    RunConfig(seed=2**64 - 1).validate()
