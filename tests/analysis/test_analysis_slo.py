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
