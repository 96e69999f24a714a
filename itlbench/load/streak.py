"""When a run gives up: a streak of failed requests, shared by the asyncio driver, the Locust workers and the
virtual clock's driver, so each ends a hopeless run the same way and says why in the same words."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from itlbench.load.backoff import THROTTLE_STATUSES
from itlbench.load.clients.sse import Outcome


def failures_reason(count: int, last_error: str) -> str:
    """An abort's reason after `count` failures in a row: the last one's own words, so the terminal can say why."""
    return f"{count} requests in a row failed, the last with {last_error[:300]}"


THROTTLED_LIMIT_S = 120.0  # a server that lets nothing through (only 429/503) for this long ends the run


@dataclass
class FailureStreak:
    """Gives up after `limit` connection errors in a row (the server is unreachable), or as many failed requests
    of any kind in a row (a server answering every request wrongly, or refusing every prompt). A 429/503 (rate
    limited, busy) is waited out (load.backoff), not counted: only `throttled_limit_s` of nothing but those
    ends the run."""

    limit: int
    connection_errors: int = 0
    failures: int = 0
    throttled_limit_s: float = THROTTLED_LIMIT_S
    throttled_since: float | None = None
    clock: Callable[[], float] = time.monotonic

    def see(self, out: Outcome) -> str | None:
        """Count one finished request; the reason to abort once a streak reaches the limit, else None."""
        if out.http_status in THROTTLE_STATUSES:
            return self._throttled(out)
        self.throttled_since = None
        self.failures = 0 if out.status == "ok" else self.failures + 1
        self.connection_errors = self.connection_errors + 1 if out.connection_error else 0
        if self.connection_errors >= self.limit:
            return f"{self.connection_errors} connection errors in a row: server unreachable"
        if self.failures >= self.limit:
            return failures_reason(self.failures, out.error or out.error_kind or out.status)
        return None

    def _throttled(self, out: Outcome) -> str | None:
        now = self.clock()
        if self.throttled_since is None:
            self.throttled_since = now
        if now - self.throttled_since >= self.throttled_limit_s:
            return (f"the server let no request through for {now - self.throttled_since:.0f} s (only HTTP "
                    f"{out.http_status}), the last with {(out.error or '')[:300]}")
        return None
