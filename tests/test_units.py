"""The token and duration grammar shared by every flag."""

from __future__ import annotations

import pytest

from itlbench.errors import ConfigError
from itlbench.units import parse_duration_s, parse_tokens


@pytest.mark.parametrize("text, seconds", [("1m30s", 90.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1m 5s", 65.0),
                                           ("150ms", 0.15), ("20", 20.0), ("1.5m", 90.0), ("500us", 5e-4)])
def test_durations_in_units_and_compound(text: str, seconds: float) -> None:
    assert parse_duration_s(text, "--duration") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["30s1m", "1s1s", "abc", "10s5", "inf", "nan", "-5", "s", ""])
def test_unreadable_durations_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration_s(text, "--duration")
    assert err.value.field == "--duration"


def test_k_is_1024_tokens() -> None:
    assert (parse_tokens("4k", "--x"), parse_tokens("1.5k", "--x")) == (4096, 1536)
