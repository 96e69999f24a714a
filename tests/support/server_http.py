"""Plain HTTP against a served engine, for the server tests: one GET as a `Reply` (an error status is a reply,
not an exception), and /metrics scraped into samples read by name and labels."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


class Reply:
    """Status, headers and body of one plain HTTP exchange."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status_code, self.headers, self.text = status, headers, body.decode()

    def json(self) -> Any:
        return json.loads(self.text)


def http(url: str, params: dict[str, Any] | None = None) -> Reply:
    if params:
        url += "?" + "&".join(f"{k}={v}" for k, v in params.items())
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return Reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.headers, err.read())


def scrape(server: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the server's /metrics, keyed by name and sorted labels."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(http(f"{server.url}/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """One sample of a `scrape` (0 when absent), for the model "tiny" unless `model_name` says otherwise."""
    labels.setdefault("model_name", "tiny")
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
