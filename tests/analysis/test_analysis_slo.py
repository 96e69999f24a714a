"""The --slo grammar."""

from __future__ import annotations

import pytest

from itlbench.analysis.goodput import DEFAULT_TTFT_S, parse_slo
from itlbench.errors import ConfigError


def test_defaults():
    slos = parse_slo(None)
    assert slos.default.ttft_s == DEFAULT_TTFT_S
    assert (slos.default.itl_stat, slos.default.itl_s) == ("p99", 0.2)
    assert parse_slo("").to_dict() == slos.to_dict()


def test_overrides_and_units():
    slos = parse_slo("ttft:le2k=2500ms, itl_p99=150ms, ttft:gt32k=2m")
    assert slos.default.ttft_s["le2k"] == pytest.approx(2.5)
    assert slos.default.ttft_s["gt32k"] == pytest.approx(120.0)
    assert slos.default.ttft_s["le128"] == 0.5
    assert slos.default.itl_s == pytest.approx(0.15)
    assert parse_slo("itl_max=800us").default.itl_stat == "max"
    assert parse_slo("ttft=3").default.ttft_s == dict.fromkeys(DEFAULT_TTFT_S, 3.0)


def test_class_overrides_inherit_the_default_in_any_order():
    slos = parse_slo("injected/ttft=off,itl_p99=100ms,chat/itl_max=1s")
    inj = slos.for_class("injected")
    assert set(inj.ttft_s.values()) == {None}
    assert inj.itl_s == pytest.approx(0.1)  # default set after the class item still applies
    assert (slos.for_class("chat").itl_stat, slos.for_class("chat").itl_s) == ("max", 1.0)
    assert slos.for_class("rag") == slos.default


@pytest.mark.parametrize(
    "spec", ["ttft:le3k=1s", "itl_p50=1s", "ttft:le2k", "ttft:le2k=fast", "ttft=-1s", "ttft=0", "=1s"]
)
def test_bad_input_names_the_flag(spec):
    with pytest.raises(ConfigError) as err:
        parse_slo(spec)
    assert err.value.field == "--slo"
    assert err.value.fix


def test_every_itl_target_given_applies():
    slo = parse_slo("itl_p99=50ms,itl_max=500ms").default
    assert slo.itl_targets == {"p99": pytest.approx(0.05), "max": pytest.approx(0.5)}
    assert parse_slo("itl_max=500ms,itl_p99=50ms").default.itl_targets.keys() == {"p99", "max"}
    assert parse_slo("itl_max=1s").default.itl_targets == {"max": 1.0}  # replaces the default p99 target


def test_both_itl_targets_judge_a_request():
    import polars as pl

    from itlbench.analysis.goodput import judge

    ttft = pl.DataFrame({"request_id": ["a", "b"], "cls": ["chat", "chat"], "bucket": ["le512", "le512"],
                         "ttft_s": [0.1, 0.1], "status": ["ok", "ok"]})
    itl = pl.DataFrame({"request_id": ["a", "b"], "itl_p99_s": [0.04, 0.08], "itl_max_s": [0.1, 0.3]})
    judged = judge(ttft, None, parse_slo("itl_p99=50ms,itl_max=500ms"), itl)
    assert judged.sort("request_id")["good"].to_list() == [True, False]


@pytest.mark.parametrize("spec", ["injectd/ttft=off", "chta/itl_p99=1s"])
def test_unknown_class_is_refused_listing_the_known(spec):
    with pytest.raises(ConfigError, match="unknown class") as err:
        parse_slo(spec)
    assert "injected" in err.value.fix and "chat" in err.value.fix


@pytest.mark.parametrize("spec", ["itl_p99=20ms,itl_p99=500ms", "chat/ttft=1s,chat/ttft=2s"])
def test_a_target_given_twice_is_refused(spec):
    with pytest.raises(ConfigError, match="twice"):
        parse_slo(spec)


def test_known_classes_are_accepted():
    assert parse_slo("fixed:2048:128/ttft=1s,trace/itl_max=1s,injected/ttft=off").classes.keys() == {
        "fixed:2048:128", "trace", "injected"}
