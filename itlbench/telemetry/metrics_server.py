"""The client's /metrics endpoint (`itlbench run --metrics-port`), which knows when it was scraped.

Prometheus reads a target once per scrape interval. An endpoint that closes the moment its run ends
takes the run's last interval with it: at the 5 s the compose stack and docs/dashboards.md use, the
final `requests_total` falls short by the requests of the last seconds and `requests_in_flight` stays
above 0 for good. So at the end `linger()` keeps serving until a scrape begun after the final values
were set has been answered, waiting at most until one scrape interval (as measured between the last
scrapes; 5 s when only one was seen) plus a margin after the latest scrape, never over MAX_LINGER_S.
It prints one line saying so. Where nothing ever scraped, or the scraper stopped coming, it returns
at once; Ctrl-C or SIGTERM ends the wait early (the run's records are complete by then).
"""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from itlbench.system.stop_signals import stop_signals

DEFAULT_INTERVAL_S = 5.0  # deploy/prometheus/prometheus.yml and docs/dashboards.md
MAX_LINGER_S = 65.0  # Prometheus' own default interval is 1 m


def say(text: str) -> None:
    """One status line on stderr (stdout may be --json)."""
    print(text, file=sys.stderr, flush=True)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _EndWait(Exception):
    pass


class MetricsServer:
    """A registry's exposition on HOST:PORT in a daemon thread, recording when each scrape began and
    when one was answered."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        server = type("_MetricsHTTPServer", (_Server,), {"address_family": _family(host, port)})
        self._app = make_wsgi_app(registry)
        self._clock = clock
        self._cond = threading.Condition()
        self._starts: deque[float] = deque(maxlen=6)  # when the latest scrapes began
        self._answered = -math.inf  # when the latest answered scrape began
        self._httpd = make_server(host, port, self._wsgi, server, handler_class=_Quiet)
        self.port = int(self._httpd.server_port)
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="itlbench-metrics",
                                        daemon=True)
        self._thread.start()

    # ---- serving (handler threads) -------------------------------------------------------------
    def _wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
            return self._app(environ, start_response)
        started = self._clock()
        with self._cond:
            self._starts.append(started)
        return self._sent(self._app(environ, start_response), started)

    def _sent(self, body: Iterable[bytes], started: float) -> Iterator[bytes]:
        yield from body  # resumed past the last chunk only once the server has written it all
        with self._cond:
            self._answered = max(self._answered, started)
            self._cond.notify_all()

    # ---- the end of the run (main thread) ------------------------------------------------------
    @property
    def interval_s(self) -> float | None:
        """The scrape interval as seen (median of the latest gaps), None before the first scrape."""
        with self._cond:
            starts = list(self._starts)
        if not starts:
            return None
        if len(starts) < 2:
            return DEFAULT_INTERVAL_S
        return min(statistics.median(b - a for a, b in zip(starts, starts[1:], strict=False)), MAX_LINGER_S)

    def linger(self) -> bool:
        """Keep serving until a scrape begun now has been answered; False where none came (or none was
        waited for)."""
        interval = self.interval_s
        if interval is None:
            return False  # nobody ever scraped: nothing to wait for
        now = self._clock()
        with self._cond:
            last = self._starts[-1]
        deadline = min(last + interval * 1.1 + 1.0, now + MAX_LINGER_S)
        if deadline <= now:
            return False  # the scraper has missed its turn already: it is not coming back
        say(f"keeping {self.url} up until Prometheus reads the run's final values (its next scrape, "
            f"at most {deadline - now:.1f} s, as it reads every {interval:.3g} s; Ctrl-C skips)")
        try:
            with stop_signals(_end_wait), self._cond:
                got = self._cond.wait_for(lambda: self._answered > now, timeout=deadline - now)
        except (_EndWait, KeyboardInterrupt):
            return False
        if not got:
            say("no scrape came: Prometheus may lack the run's last seconds")
        return got

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _family(host: str, port: int) -> socket.AddressFamily:
    with contextlib.suppress(OSError):
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _end_wait(_sig: signal.Signals) -> None:
    """SIGINT and SIGTERM end the linger instead of the process (the run's records are complete by then)."""
    raise _EndWait
