"""The --inject grammar and the injected requests it schedules."""

from __future__ import annotations

import pytest

from itlbench.errors import ConfigError
from itlbench.workloads import (
    Injection,
    LoadSpec,
    build_load_plan,
    injection_times,
    parse_injections,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32k", [Injection(32000, 1, (25.0,), None, "32k")]),
        ("5000", [Injection(5000, 1, (25.0,), None, "5000")]),
        ("1.5k", [Injection(1500, 1, (25.0,), None, "1.5k")]),
        ("32K@20s", [Injection(32000, 1, (20.0,), None, "32K@20s")]),
        ("16k@7", [Injection(16000, 1, (7.0,), None, "16k@7")]),
        ("8k@500ms", [Injection(8000, 1, (0.5,), None, "8k@500ms")]),
        ("8k@1m", [Injection(8000, 1, (60.0,), None, "8k@1m")]),
        ("2x16k@10s,40s", [Injection(16000, 2, (10.0, 40.0), None, "2x16k@10s,40s")]),
        ("32k/30s", [Injection(32000, 1, (25.0,), 30.0, "32k/30s")]),
        ("4k@5s/10s", [Injection(4000, 1, (5.0,), 10.0, "4k@5s/10s")]),
        (" 32k ; 1k@3s ", [Injection(32000, 1, (25.0,), None, "32k"),
                           Injection(1000, 1, (3.0,), None, "1k@3s")]),
    ],
)
def test_parses_every_form(text: str, expected: list[Injection]) -> None:
    assert parse_injections(text, default_at_s=25.0) == expected


def test_repeated_flags_and_empty() -> None:
    assert parse_injections(None, 1.0) == []
    assert parse_injections("", 1.0) == []
    both = parse_injections(["32k@1s", "2k@2s;3k@3s"], 0.0)
    assert [i.tokens for i in both] == [32000, 2000, 3000]


@pytest.mark.parametrize("bad", ["32q", "k", "0", "0x4k", "x4k", "1.2345k", "32k@", "32k@10s,",
                                 "32k@-1s", "32k/0s", "32k@1s,2s/5s", "32k@20h", "4k@10s@20s"])
def test_rejects_bad_specs_naming_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_injections(bad, 10.0)
    assert err.value.field == "--inject"
    assert "32k@20s" in str(err.value)  # the examples


def test_message_quotes_the_bad_spec() -> None:
    with pytest.raises(ConfigError, match="cannot read '32q'"):
        parse_injections("32q", 0.0)


def test_schedule_copies_at_each_time() -> None:
    sched = injection_times(parse_injections("2x16k@10s,40s", 0.0), 60.0)
    assert sched == [(10.0, 16000), (10.0, 16000), (40.0, 16000), (40.0, 16000)]


def test_periodic_schedule_starts_at_default_or_at_time() -> None:
    assert injection_times(parse_injections("32k/30s", 20.0), 100.0) == [
        (20.0, 32000), (50.0, 32000), (80.0, 32000)]
    assert injection_times(parse_injections("1k@0s/25s", 99.0), 100.0) == [
        (0.0, 1000), (25.0, 1000), (50.0, 1000), (75.0, 1000)]


def test_schedule_is_time_ordered_and_stops_at_duration() -> None:
    sched = injection_times(parse_injections("1k@50s;2k@5s;3k@70s", 0.0), 60.0)
    assert sched == [(5.0, 2000), (50.0, 1000)]


def test_injected_requests_are_tagged() -> None:
    spec = LoadSpec(workload="chat", streams=1, duration_s=60, inject="32k;2x1k@5s,6s",
                    inject_max_tokens=8, max_model_len=32768)
    injected = [p for p in build_load_plan(spec).open_loop if p.injected]
    assert [(p.send_at_s, p.prompt_tokens) for p in injected] == [
        (5.0, 1000), (5.0, 1000), (6.0, 1000), (6.0, 1000), (30.0, 32000)]
    assert {p.cls for p in injected} == {"injected"}
    assert {p.max_tokens for p in injected} == {8}
    assert [p.request_id for p in injected] == ["inj-000", "inj-001", "inj-002", "inj-003", "inj-004"]
    assert all(len(p.prompt_token_ids or ()) == p.prompt_tokens for p in injected)
    assert len({p.prompt_token_ids[:4] for p in injected if p.prompt_token_ids}) == 5


def test_default_time_comes_from_spec() -> None:
    spec = LoadSpec(streams=1, duration_s=100, inject="1k", inject_at_s=12.5)
    plan = build_load_plan(spec)
    assert [p.send_at_s for p in plan.open_loop] == [12.5]
    assert plan.description["injections"] == [[12.5, 1000]]


def test_too_long_injection_is_refused_with_a_fix() -> None:
    spec = LoadSpec(streams=1, inject="32k", max_model_len=32000, inject_max_tokens=16)
    with pytest.raises(ConfigError) as err:
        build_load_plan(spec)
    assert err.value.field == "--inject"
    assert "31984" in err.value.fix


def test_injection_after_the_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="after the run ends"):
        build_load_plan(LoadSpec(streams=1, duration_s=30, inject="1k@40s"))
