"""Blocking JSON over HTTP for the few control calls made outside the load (probes, health, engine
info); the load itself goes through the pooled aiohttp client."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def request_json(url: str, body: dict[str, Any] | None = None, api_key: str | None = None,
                 timeout: float = 10.0) -> dict[str, Any]:
    """GET (or POST `body`) and decode the JSON reply; network and decoding errors propagate."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback or the user's endpoint
        return json.loads(resp.read().decode())
