"""Scrape an external engine's Prometheus `/metrics` into the `server_metrics` table.

Only engine series are kept: names starting `vllm:`, `sglang:` or `itlbench_`. Histograms are kept
as their `_bucket`/`_sum`/`_count` samples. The prefix present tells which engine is behind the URL.
Parsing runs in a thread so a large exposition does not stall the driver's event loop.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from itlbench.load.sink import RowWriter

PREFIXES = ("vllm:", "sglang:", "itlbench_")


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


class MetricsSampler:
    """Scrapes every `interval_s`; `prefix` becomes the engine prefix found (None until found)."""

    def __init__(self, base_url: str, writer: RowWriter, *, api_key: str | None = None,
                 interval_s: float = 5.0) -> None:
        self.url = metrics_url(base_url)
        self.writer = writer
        self.interval_s = interval_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.prefixes: set[str] = set()
        self.scrapes = 0
        self.failures = 0

    @property
    def prefix(self) -> str | None:
        return next((p for p in PREFIXES if p in self.prefixes), None)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval_s))) as session:
            while True:
                started = time.perf_counter()
                try:
                    await self.scrape(session)
                except (aiohttp.ClientError, OSError, ValueError):
                    self.failures += 1
                await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))

    async def scrape(self, session: aiohttp.ClientSession) -> int:
        t_ns = time.perf_counter_ns()
        async with session.get(self.url, headers=self.headers) as resp:
            resp.raise_for_status()
            text = await resp.text()
        rows, seen = await asyncio.to_thread(parse_samples, text, t_ns)
        self.prefixes |= seen
        for row in rows:
            self.writer.add("server_metrics", row)
        self.scrapes += 1
        return len(rows)


async def sample_metrics(base_url: str, writer: RowWriter, *, api_key: str | None = None,
                         interval_s: float = 5.0) -> None:
    """Run a sampler until cancelled (start it as a task next to `drive`)."""
    await MetricsSampler(base_url, writer, api_key=api_key, interval_s=interval_s).run()
