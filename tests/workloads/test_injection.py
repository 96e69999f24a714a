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
        ("32k", [Injection(32768, 1, (25.0,), None, "32k")]),
        ("5000", [Injection(5000, 1, (25.0,), None, "5000")]),
        ("1.5k", [Injection(1536, 1, (25.0,), None, "1.5k")]),
        ("32K@20s", [Injection(32768, 1, (20.0,), None, "32K@20s")]),
        ("16k@7", [Injection(16384, 1, (7.0,), None, "16k@7")]),
        ("8k@500ms", [Injection(8192, 1, (0.5,), None, "8k@500ms")]),
        ("8k@1m", [Injection(8192, 1, (60.0,), None, "8k@1m")]),
        ("2x16k@10s,40s", [Injection(16384, 2, (10.0, 40.0), None, "2x16k@10s,40s")]),
        ("32k/30s", [Injection(32768, 1, (15.0,), 30.0, "32k/30s")]),  # half a period in
        ("4k@5s/10s", [Injection(4096, 1, (5.0,), 10.0, "4k@5s/10s")]),
        (" 32k ; 1k@3s ", [Injection(32768, 1, (25.0,), None, "32k"),
                           Injection(1024, 1, (3.0,), None, "1k@3s")]),
    ],
)
def test_parses_every_form(text: str, expected: list[Injection]) -> None:
    assert parse_injections(text, default_at_s=25.0) == expected


def test_repeated_flags_and_empty() -> None:
    assert parse_injections(None, 1.0) == []
    assert parse_injections("", 1.0) == []
    both = parse_injections(["32k@1s", "2k@2s;3k@3s"], 0.0)
    assert [i.tokens for i in both] == [32768, 2048, 3072]


@pytest.mark.parametrize("bad", ["32q", "k", "0", "0x4k", "x4k", "1.2345k", "32k@", "32k@10s,",
                                 "32k@-1s", "32k/0s", "32k@1s,2s/5s", "32k@20d", "4k@10s@20s"])
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
    assert sched == [(10.0, 16384), (10.0, 16384), (40.0, 16384), (40.0, 16384)]


def test_periodic_schedule_starts_half_a_period_in_or_at_time() -> None:
    assert injection_times(parse_injections("32k/30s", 20.0), 100.0) == [
        (15.0, 32768), (45.0, 32768), (75.0, 32768)]
    assert injection_times(parse_injections("1k@0s/25s", 99.0), 100.0) == [
        (0.0, 1024), (25.0, 1024), (50.0, 1024), (75.0, 1024)]


def test_schedule_is_time_ordered_and_stops_at_duration() -> None:
    sched = injection_times(parse_injections("1k@50s;2k@5s;3k@70s", 0.0), 60.0)
    assert sched == [(5.0, 2048), (50.0, 1024)]


def test_injected_requests_are_tagged() -> None:
    spec = LoadSpec(workload="chat", streams=1, duration_s=60, inject="32k;2x1k@5s,6s",
                    inject_max_tokens=8, max_model_len=40000)
    injected = [p for p in build_load_plan(spec).open_loop if p.injected]
    assert [(p.send_at_s, p.prompt_tokens) for p in injected] == [
        (5.0, 1024), (5.0, 1024), (6.0, 1024), (6.0, 1024), (30.0, 32768)]
    assert {p.cls for p in injected} == {"injected"}
    assert {p.max_tokens for p in injected} == {8}
    assert [p.request_id for p in injected] == ["inj-000", "inj-001", "inj-002", "inj-003", "inj-004"]
    assert all(len(p.prompt_token_ids or ()) == p.prompt_tokens for p in injected)
    assert len({p.prompt_token_ids[:4] for p in injected if p.prompt_token_ids}) == 5


def test_default_time_comes_from_spec() -> None:
    spec = LoadSpec(streams=1, duration_s=100, inject="1k", inject_at_s=12.5)
    plan = build_load_plan(spec)
    assert [p.send_at_s for p in plan.open_loop] == [12.5]
    assert plan.description["injections"] == [[12.5, 1024]]


def test_too_long_injection_is_refused_with_a_fix() -> None:
    spec = LoadSpec(streams=1, inject="32k", max_model_len=32000, inject_max_tokens=16)
    with pytest.raises(ConfigError) as err:
        build_load_plan(spec)
    assert err.value.field == "--inject"
    assert "31984" in err.value.fix


def test_injection_after_the_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="after the run ends"):
        build_load_plan(LoadSpec(streams=1, duration_s=30, inject="1k@40s"))


def test_k_is_1024_so_32k_lands_in_the_le32k_bucket() -> None:
    from itlbench.analysis.buckets import bucket_for
    from itlbench.core.engine_config import parse_chunk_budget

    (inj,) = parse_injections("32k", 0.0)
    assert inj.tokens == 32 * 1024 == parse_chunk_budget("32k")
    assert bucket_for(inj.tokens) == "le32k"
    assert bucket_for(parse_injections("32k", 0.0)[0].tokens + 1) == "gt32k"


def test_an_endpoint_run_refuses_an_injection_outside_its_window_before_it_probes_the_server(tmp_path) -> None:
    """Against an --endpoint, '8k/30s' in a 20 s run was refused only after "probing …" (and the live metrics'
    lines): the times need no server, only its context length does. Nothing listens on the port here."""
    from typer.testing import CliRunner

    from itlbench.cli import app

    result = CliRunner().invoke(app, ["run", "--endpoint", "http://127.0.0.1:9/v1", "--inject", "8k/30s",
                                      "--duration", "20", "--out", str(tmp_path / "run")], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "--inject: '8k/30s' repeats every 30 s, longer than the 20 s run" in " ".join(result.output.split())
    assert "probing" not in result.output and not (tmp_path / "run").exists()
