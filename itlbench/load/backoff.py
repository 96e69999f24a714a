"""Waiting out a rate-limited server: a 429 or 503 makes its stream wait before the next send (the server's
Retry-After, in seconds or as an HTTP date, capped; else an exponential backoff), so a limited server slows the
load down instead of drawing a burst of refusals that ends the run in milliseconds."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field

THROTTLE_STATUSES = (429, 503)
MAX_RETRY_AFTER_S = 60.0  # a server asking for longer is still retried after this (the run has a duration)
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date), within [0, MAX_RETRY_AFTER_S];
    None when absent or unreadable (the server's header is untrusted)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass
class Backoff:
    """Per-stream waits after throttled answers, and their totals for run.json's `rate_limited`."""

    streak: dict[int, int] = field(default_factory=dict)  # throttled answers in a row, per stream
    waits: int = 0
    wait_s: float = 0.0
    max_wait_s: float = 0.0
    with_retry_after: int = 0

    def wait_for(self, stream: int, http_status: int | None, retry_after: str | None) -> float:
        """How long `stream` waits before its next send after an answer with this status (0: not throttled)."""
        if http_status not in THROTTLE_STATUSES:
            self.streak.pop(stream, None)
            return 0.0
        n = self.streak[stream] = self.streak.get(stream, 0) + 1
        asked = retry_after_s(retry_after)
        wait = asked if asked is not None else min(FIRST_BACKOFF_S * 2 ** (n - 1), MAX_BACKOFF_S)
        self.waits += 1
        self.with_retry_after += asked is not None
        self.wait_s += wait
        self.max_wait_s = max(self.max_wait_s, wait)
        return wait

    def doc(self) -> dict[str, float | int] | None:
        """run.json's `rate_limited`: None when the server never throttled."""
        if not self.waits:
            return None
        return {"waits": self.waits, "with_retry_after": self.with_retry_after, "wait_s": round(self.wait_s, 3),
                "max_wait_s": round(self.max_wait_s, 3)}
