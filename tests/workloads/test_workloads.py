"""Catalog, samplers, arrivals, prompts and the assembled load plan."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from itlbench.errors import ConfigError
from itlbench.workloads import (
    CATALOG,
    WORDS,
    LoadSpec,
    PromptBuilder,
    RequestPlan,
    arrival_times,
    build_load_plan,
    catalog_table,
    get_workload,
    sample_lengths,
)


def _take(it, n: int) -> list[RequestPlan]:
    return list(itertools.islice(it, n))


def test_catalog_matches_design() -> None:
    expected = {"chat-short": (50, 300), "chat": (500, 500), "rag": (8000, 400),
                "summarization": (32000, 500), "code": (2000, 50), "agent": (4000, 100)}
    for name, (mean_in, mean_out) in expected.items():
        assert (CATALOG[name].mean_in, CATALOG[name].mean_out) == (mean_in, mean_out)
    assert CATALOG["trace"].from_trace
    assert CATALOG["rag"].shared_prefix is not None and CATALOG["agent"].sessions is not None
    rows = catalog_table()
    assert [r[0] for r in rows] == list(CATALOG)
    assert ("agent", "4000", "100", "4000:100 per turn") == rows[5][:4]


def test_unknown_workload_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        get_workload("chatty")
    assert err.value.field == "--workload"
    assert "chat-short" in err.value.fix and "agent" in err.value.fix


@pytest.mark.parametrize("name", ["chat-short", "chat", "rag", "summarization", "code", "agent"])
def test_lognormal_means_hit_targets(name: str) -> None:
    spec = CATALOG[name]
    rng = np.random.default_rng(7)
    for mean in (spec.mean_in, spec.mean_out):
        draws = sample_lengths(rng, mean, spec.sigma, 20_000, 1, 10**9)
        assert abs(draws.mean() / mean - 1) < 0.03


def test_clipping_bounds_lengths() -> None:
    draws = sample_lengths(np.random.default_rng(0), 32000, 0.25, 5000, 1, 8000)
    assert draws.min() >= 1 and draws.max() == 8000


def test_plan_means_follow_catalog() -> None:
    plan = build_load_plan(LoadSpec(workload="chat", streams=4, max_model_len=10**6, seed=3))
    reqs = [r for s in plan.streams for r in _take(s, 1500)]
    assert abs(np.mean([r.prompt_tokens for r in reqs]) / 500 - 1) < 0.03
    assert abs(np.mean([r.max_tokens for r in reqs]) / 500 - 1) < 0.03


def test_poisson_gaps_have_mean_one_over_rate() -> None:
    times = np.array(list(arrival_times(50.0, 400.0, seed=1)))
    gaps = np.diff(times)
    assert abs(gaps.mean() * 50.0 - 1) < 0.03
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05
    assert times.min() >= 0 and times.max() < 400.0


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_cv(burstiness: float) -> None:
    gaps = np.diff(np.array(list(arrival_times(100.0, 400.0, burstiness, seed=2))))
    assert abs(gaps.mean() * 100.0 - 1) < 0.05
    assert abs(gaps.std() / gaps.mean() - burstiness ** -0.5) < 0.05 * burstiness ** -0.5


def test_arrivals_are_seeded() -> None:
    assert list(arrival_times(5, 20, seed=4)) == list(arrival_times(5, 20, seed=4))
    assert list(arrival_times(5, 20, seed=4)) != list(arrival_times(5, 20, seed=5))


def test_id_prompts_are_exact_and_avoid_reserved_ids() -> None:
    builder = PromptBuilder(vocab_size=300, reserved_ids=range(100, 200), low=5, seed=1)
    for n in (0, 1, 17, 4096):
        ids = builder.unique(f"r{n}", n).ids
        assert ids is not None and len(ids) == n
        assert all(5 <= i < 300 and not 100 <= i < 200 for i in ids)
    assert builder.unique("a", 64) == builder.unique("a", 64)
    assert builder.unique("a", 64).ids[:8] != builder.unique("b", 64).ids[:8]
    assert builder.shared("a", 64).ids != builder.unique("a", 64).ids


def test_no_usable_ids_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        PromptBuilder(vocab_size=10, low=10)


def test_text_prompts_use_one_token_words_and_calibrate() -> None:
    builder = PromptBuilder(token_ids=False, seed=0)
    prompt = builder.unique("x", 200)
    assert prompt.ids is None and prompt.text is not None
    words = prompt.text.split(" ")[1:]
    assert len(words) == 200 and all(" " + w in WORDS for w in words)
    builder.calibrate(1.25)
    assert len(builder.unique("y", 200).text.split(" ")[1:]) == 160
    with pytest.raises(ValueError):
        builder.calibrate(0)


@pytest.mark.parametrize("name, context", [("chat-short", 6000), ("chat", 6000), ("rag", 9000),
                                           ("summarization", 34000), ("code", 6000), ("agent", 6000)])
def test_every_prompt_is_exact_and_clipped_to_context(name: str, context: int) -> None:
    plan = build_load_plan(LoadSpec(workload=name, streams=2, max_model_len=context, rate=5.0,
                                    duration_s=4.0, inject="5k@1s", seed=9))
    reqs = [r for s in plan.streams for r in _take(s, 40)] + list(plan.open_loop)
    reqs += [r for session in plan.sessions for r in session.turns]  # agent: sessions arrive at --rate
    for r in reqs:
        assert r.prompt_tokens >= 1 and r.max_tokens >= 1
        assert r.prompt_tokens + r.max_tokens <= context
        assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.prompt_tokens
    assert len({r.request_id for r in reqs}) == len(reqs)


def test_rag_requests_sharing_a_document_share_its_prefix() -> None:
    plan = build_load_plan(LoadSpec(workload="rag", streams=2, seed=5))
    reqs = [r for s in plan.streams for r in _take(s, 60)]
    by_prefix: dict[tuple[int, ...], list[RequestPlan]] = {}
    for r in reqs:
        by_prefix.setdefault(r.prompt_token_ids[:64], []).append(r)
    assert len(by_prefix) <= CATALOG["rag"].shared_prefix.num_documents
    group = max(by_prefix.values(), key=len)
    assert len(group) >= 2
    a, b = group[0].prompt_token_ids, group[1].prompt_token_ids
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common >= 1000  # a whole document, then the unique question
    assert a != b


def test_agent_turns_extend_the_previous_prompt() -> None:
    plan = build_load_plan(LoadSpec(workload="agent", streams=1, seed=2, max_model_len=16384))
    reqs = _take(plan.streams[0], 120)
    sessions: dict[str, list[RequestPlan]] = {}
    for r in reqs:
        sessions.setdefault(r.session, []).append(r)
    assert len(sessions) >= 5
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        assert turns[0].think_time_s == 0.0
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.prompt_token_ids[:prev.prompt_tokens] == prev.prompt_token_ids
            assert nxt.prompt_tokens > prev.prompt_tokens + prev.max_tokens
            assert nxt.think_time_s > 0
    assert all(len(t) <= 8 for t in sessions.values())
    assert any(len(t) >= 3 for t in sessions.values())
    assert all(r.prompt_tokens + r.max_tokens <= 16384 for r in reqs)


def test_agent_sessions_stay_within_a_small_context() -> None:
    plan = build_load_plan(LoadSpec(workload="agent", streams=1, seed=2, max_model_len=3000))
    reqs = _take(plan.streams[0], 200)
    assert all(r.prompt_tokens + r.max_tokens <= 3000 for r in reqs)
    assert len({r.session for r in reqs}) > 200 / 8


def test_text_mode_agent_prefixes_are_exact() -> None:
    plan = build_load_plan(LoadSpec(workload="agent", streams=1, token_ids=False, seed=1))
    reqs = _take(plan.streams[0], 30)
    assert all(r.prompt_token_ids is None and r.prompt_text for r in reqs)
    for prev, nxt in itertools.pairwise(reqs):
        if nxt.session == prev.session:
            assert nxt.prompt_text.startswith(prev.prompt_text)


def _fingerprint(seed: int) -> list[tuple]:
    plan = build_load_plan(LoadSpec(workload="agent", streams=3, rate=4.0, duration_s=5.0,
                                    inject="2k@1s", seed=seed))
    reqs = [r for s in plan.streams for r in _take(s, 10)] + list(plan.open_loop)
    reqs += [replace(r, send_at_s=s.arrive_at_s) for s in plan.sessions for r in s.turns]
    return [(r.request_id, r.prompt_tokens, r.max_tokens, r.send_at_s, r.think_time_s,
             r.prompt_token_ids) for r in reqs]


def test_same_seed_same_plan_different_seed_different() -> None:
    assert _fingerprint(11) == _fingerprint(11)
    assert _fingerprint(11) != _fingerprint(12)


def test_streams_differ_from_each_other() -> None:
    plan = build_load_plan(LoadSpec(workload="chat", streams=2))
    a, b = (_take(s, 5) for s in plan.streams)
    assert [r.prompt_tokens for r in a] != [r.prompt_tokens for r in b]
    assert a[0].request_id == "s00-000000" and b[3].request_id == "s01-000003"
    assert a[0].stream == 0 and a[0].send_at_s is None and a[0].cls == "chat"


def test_open_loop_is_time_ordered_within_duration() -> None:
    plan = build_load_plan(LoadSpec(workload="code", rate=20.0, burstiness=0.5, duration_s=10.0,
                                    inject="1k@2s;1k/3s"))
    assert plan.streams == []
    reqs = list(plan.open_loop)
    times = [r.send_at_s for r in reqs]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 10.0
    assert [r.send_at_s for r in reqs if r.injected] == [1.5, 2.0, 4.5, 7.5]  # /3s: half a period in
    assert reqs[0].request_id.startswith(("o-", "inj-"))
    assert plan.description["arrivals"] == "gamma"


def test_default_streams_and_description() -> None:
    plan = build_load_plan(LoadSpec(workload="chat"))
    assert len(plan.streams) == 32
    desc = plan.description
    assert desc["streams"] == 32 and desc["workload"]["name"] == "chat"
    assert desc["prompt_mode"] == "token_ids" and desc["rate"] is None


@pytest.mark.parametrize(
    ("spec", "flag"),
    [
        (LoadSpec(streams=-1), "--streams"),
        (LoadSpec(rate=0.0), "--rate"),
        (LoadSpec(rate=-2.0), "--rate"),
        (LoadSpec(duration_s=0), "--duration"),
        (LoadSpec(burstiness=0), "--burstiness"),
        (LoadSpec(output_tokens=0), "--output-tokens"),
        (LoadSpec(inject_max_tokens=0), "--inject-max-tokens"),
        (LoadSpec(inject="32q"), "--inject"),
        (LoadSpec(workload="nope"), "--workload"),
        (LoadSpec(streams=0), "--streams"),
        (LoadSpec(trace_path="x.csv"), "--trace"),
    ],
)
def test_validation_names_the_flag(spec: LoadSpec, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_load_plan(spec)
    assert err.value.field == flag
    assert err.value.fix


def test_output_override_applies_to_workload_requests() -> None:
    plan = build_load_plan(LoadSpec(workload="chat", streams=1, output_tokens=7))
    assert {r.max_tokens for r in _take(plan.streams[0], 20)} == {7}


def test_fixed_shape_workload_has_exact_lengths_and_distinct_prompts() -> None:
    plan = build_load_plan(LoadSpec(workload="fixed:300:40", streams=3, max_model_len=4096, seed=5))
    reqs = [r for s in plan.streams for r in _take(s, 10)]
    assert {(r.prompt_tokens, r.max_tokens) for r in reqs} == {(300, 40)}
    assert all(len(r.prompt_token_ids) == 300 for r in reqs)
    assert len({tuple(r.prompt_token_ids) for r in reqs}) == len(reqs)  # never re-hits a prefix cache


@pytest.mark.parametrize("name", ["fixed:", "fixed:10", "fixed:0:5", "fixed:a:5", "fixed:5:5:5"])
def test_a_malformed_fixed_shape_names_the_flag_and_the_form(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        get_workload(name)
    assert err.value.field == "--workload" and "fixed:IN:OUT" in str(err.value)


@pytest.mark.parametrize("name", ["fixed:200000:10", "fixed:8000:500", "fixed:99999999999999999999:10",
                                  "summarization"])
def test_lengths_beyond_the_context_are_refused(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_load_plan(LoadSpec(workload=name, streams=1, max_model_len=8192))
    assert err.value.field == "--workload" and ("8192" in str(err.value) or "16,777,216" in str(err.value))


def test_fixed_lengths_take_k_as_1024() -> None:
    plan = build_load_plan(LoadSpec(workload="fixed:4k:1k", streams=1, max_model_len=8192))
    first = next(plan.streams[0])
    assert (first.prompt_tokens, first.max_tokens) == (4096, 1024)
    assert plan.description["warnings"] == []


def test_a_mix_whose_tail_is_shortened_warns_how_many() -> None:
    plan = build_load_plan(LoadSpec(workload="code", streams=1, max_model_len=4096))
    (warning,) = plan.description["warnings"]
    assert warning.startswith("--workload code: about ") and "4046 tokens" in warning
    assert build_load_plan(LoadSpec(workload="code", streams=1)).description["warnings"] == []


def test_a_period_longer_than_the_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="repeats every 30 s") as err:
        build_load_plan(LoadSpec(workload="chat", streams=1, duration_s=20.0, inject="8k/30s"))
    assert err.value.field == "--inject"


@pytest.mark.parametrize("inject, duration, count", [("8k/30s", 60.0, 2), ("8k/1s", 20.0, 20), ("1k/10s", 60.0, 6)])
def test_every_period_sends_about_duration_over_period(inject: str, duration: float, count: int) -> None:
    plan = build_load_plan(LoadSpec(workload="chat", streams=1, duration_s=duration, inject=inject))
    assert len(plan.description["injections"]) == count


def test_trace_with_rate_names_the_time_scale_flag(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.680590,100,10\n")
    with pytest.raises(ConfigError, match="use --time-scale to speed it up"):
        build_load_plan(LoadSpec(workload="trace", trace_path=str(path), rate=5.0))


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_rag_prompts_average_the_catalog_mean_for_every_seed(seed: int) -> None:
    # was: 8 lognormal documents averaged 8,654 tokens under seed 1 and 7,369 under seed 5 (catalog: 8000)
    plan = build_load_plan(LoadSpec(workload="rag", streams=1, seed=seed, max_model_len=131072))
    reqs = _take(plan.streams[0], 1500)
    assert abs(np.mean([r.prompt_tokens for r in reqs]) / CATALOG["rag"].mean_in - 1) < 0.02
    assert len({r.prompt_tokens for r in reqs}) > 100


