"""FailureStreak: when a driver gives up, and the words it gives."""

from __future__ import annotations

from itlbench.load.clients.sse import Outcome
from itlbench.load.streak import FailureStreak


def _out(status: str, *, connection_error: bool = False, error: str | None = None) -> Outcome:
    return Outcome(status, connection_error, None if connection_error else 400, 0, 1, None,
                   None if status == "ok" else ("connection" if connection_error else "http_status"), error)


def test_failures_in_a_row_give_up_with_the_last_ones_words_and_an_ok_resets_them():
    streak = FailureStreak(limit=3)
    assert streak.see(_out("error", error="HTTP 400: first")) is None
    assert streak.see(_out("ok")) is None
    assert streak.see(_out("error", error="HTTP 400: a")) is None
    assert streak.see(_out("timeout", error="no end of stream within 5 s")) is None
    assert streak.see(_out("error", error="HTTP 400: prompt too long")) == \
        "3 requests in a row failed, the last with HTTP 400: prompt too long"


def test_connection_errors_say_the_server_is_unreachable_and_a_long_message_is_cut():
    streak = FailureStreak(limit=2)
    streak.see(_out("error", connection_error=True, error="ClientConnectorError"))
    assert streak.see(_out("error", connection_error=True)) == "2 connection errors in a row: server unreachable"
    words = FailureStreak(limit=1).see(_out("error", error="HTTP 500: " + "x" * 1000))
    assert words is not None and len(words) < 400
