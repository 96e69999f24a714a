"""Blocking JSON over HTTP for the few control calls made outside the load (probes, health, engine
info); the load itself goes through the pooled aiohttp client.

The peer may be hostile or broken, so a reply is bounded twice: in size (`max_bytes`, the `control`
limit of `load.clients.limits`: a bigger reply raises ReplyTooLarge) and in time (`timeout` is
the whole call's deadline, not only each socket operation's: a server trickling bytes raises
TimeoutError). A reply that is not JSON raises NotJson, one that is not a JSON object ValueError (NotJson
is one too); callers catch ValueError and OSError and say which URL failed."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from itlbench.load.clients.limits import Limits

CONTROL_REPLY_BYTES = Limits.control_bytes
_PIECE = 64 << 10


class ReplyTooLarge(ValueError):
    """A control reply bigger than its cap."""


class NotJson(json.JSONDecodeError):
    """A reply that does not parse as JSON (a web page, a proxy's error text): its content type and first
    characters, so the error can say what answered instead of "Expecting value: line 1 column 1"."""

    def __init__(self, url: str, content_type: str, raw: bytes) -> None:
        self.content_type = content_type or "no content type"
        self.head = " ".join(raw[:240].decode("utf-8", "replace").split())[:60]
        super().__init__(f"{url} answered {self.content_type}, not JSON: {self.head!r}", self.head, 0)

    def __str__(self) -> str:
        return self.msg  # not JSONDecodeError's ": line 1 column 1 (char 0)"


def request_json(url: str, body: dict[str, Any] | None = None, api_key: str | None = None,
                 timeout: float = 10.0, max_bytes: int = CONTROL_REPLY_BYTES) -> dict[str, Any]:
    """GET (or POST `body`) and decode the JSON object replied; network and decoding errors propagate."""
    deadline = time.monotonic() + timeout
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback or the user's endpoint
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise ReplyTooLarge(f"reply_too_large: {url} announces {declared} bytes, over the {max_bytes}-byte "
                                "control limit (--limits control=...)")
        pieces, size = [], 0
        while piece := resp.read1(_PIECE) if hasattr(resp, "read1") else resp.read(_PIECE):
            size += len(piece)
            if size > max_bytes:
                raise ReplyTooLarge(f"reply_too_large: {url} sent more than {max_bytes} bytes "
                                    "(--limits control=...)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish its reply within {timeout:g} s")
            pieces.append(piece)
        content_type = resp.headers.get("Content-Type", "")
    raw = b"".join(pieces)
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise NotJson(url, content_type, raw) from None
    if not isinstance(obj, dict):
        raise ValueError(f"{url} replied {type(obj).__name__} JSON, not an object")
    return obj
