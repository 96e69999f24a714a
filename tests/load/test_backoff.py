"""A rate-limited server is waited out (Retry-After, else a backoff), not hammered until the run aborts."""

from __future__ import annotations

import email.utils

import pytest

from itlbench.load.backoff import MAX_RETRY_AFTER_S, Backoff, retry_after_s
from itlbench.load.clients.sse import Outcome, error_text
from itlbench.load.streak import FailureStreak


@pytest.mark.parametrize(("value", "seconds"), [("2", 2.0), (" 0.5 ", 0.5), ("-3", 0.0), ("86400", MAX_RETRY_AFTER_S),
                                                (None, None), ("", None), ("soon", None), ("nan", None)])
def test_retry_after_reads_seconds_capped(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds


def test_retry_after_reads_an_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_s(email.utils.formatdate(now + 7, usegmt=True), now=now) == pytest.approx(7.0)
    assert retry_after_s(email.utils.formatdate(now - 7, usegmt=True), now=now) == 0.0


def test_a_stream_waits_what_the_server_asks_else_backs_off_and_the_waits_are_counted() -> None:
    b = Backoff()
    assert b.wait_for(0, 200, None) == 0.0 and b.doc() is None
    assert b.wait_for(0, 429, "2") == 2.0
    assert [b.wait_for(1, 503, None) for _ in range(3)] == [0.5, 1.0, 2.0]  # none given: exponential
    assert b.wait_for(1, 200, None) == 0.0 and b.wait_for(1, 503, None) == 0.5  # an answer resets its streak
    assert b.doc() == {"waits": 5, "with_retry_after": 1, "wait_s": 6.0, "max_wait_s": 2.0}


def _throttled(status: int = 429) -> Outcome:
    return Outcome("error", False, status, 0, 1, None, "http_status", error_text(status, b'{"error": {"message": "Rate limit reached"}}'))


def test_throttled_answers_never_abort_in_a_burst_but_do_after_long_without_one_through() -> None:
    now = [0.0]
    streak = FailureStreak(limit=3, throttled_limit_s=120.0, clock=lambda: now[0])
    assert all(streak.see(_throttled()) is None for _ in range(100))  # 100 in a row, at one instant
    now[0] = 119.0
    assert streak.see(_throttled(503)) is None
    now[0] = 121.0
    reason = streak.see(_throttled())
    assert reason is not None and "let no request through for 121 s" in reason and "Rate limit reached" in reason
    streak.see(Outcome("ok", False, 200, 1, 1, 1))
    assert streak.see(_throttled()) is None  # one through: the clock starts again


@pytest.mark.parametrize(("raw", "ctype", "text"), [
    (b'{"detail": "Not Found"}', "application/json", 'HTTP 404: {"detail": "Not Found"}'),
    (b'{"error": {"message": "no such model"}}', None, "HTTP 404: no such model"),
    (b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr>"
     b"<center>nginx</center></body></html>", "text/html", "HTTP 502: 502 Bad Gateway (HTML page)"),
    (b"<html>\n<body>\n<h1>Oops</h1>\n<p>more</p></body></html>", None, "HTTP 500: Oops (HTML page)"),
    (b"Internal Server Error", "text/plain", "HTTP 500: Internal Server Error"),
])
def test_error_bodies_print_as_sent_and_html_pages_as_their_title(raw: bytes, ctype: str | None, text: str) -> None:
    assert error_text(int(text[5:8]), raw, ctype) == text
