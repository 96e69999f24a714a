"""Where and how to send: one OpenAI-compatible server and what request fields it accepts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from itlbench.errors import ConfigError

ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions"}
STREAM_READERS = ("auto", "kernel", "aiohttp")


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server. `base_url` ends in `/v1`.

    `accepts_token_ids`: send exact token-id prompts (completions endpoint only); else text.
    `forced_lengths`: add `ignore_eos` and `min_tokens = max_tokens` so every request generates
    exactly `max_tokens` (vLLM, SGLang and itlbench accept them; strict OpenAI servers do not).
    `timeout_s`: whole-request limit; None waits forever.
    `stream_reader`: `kernel` (kernel receive stamps, plain HTTP on Linux), `aiohttp` (user-space
    stamps), or `auto` (kernel where it can, else aiohttp).
    """

    base_url: str
    model: str
    api_key: str | None = None
    api: str = "completions"  # completions | chat
    accepts_token_ids: bool = True
    forced_lengths: bool = True
    timeout_s: float | None = 600.0
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    stream_reader: str = "auto"
    max_event_bytes: int = 4 << 20  # an SSE event past this fails its request (event_too_large)
    max_head_bytes: int = 64 << 10  # a response head past this fails its request (head_too_large)

    def __post_init__(self) -> None:
        if self.stream_reader not in STREAM_READERS:
            raise ConfigError("--stream-reader", f"unknown reader {self.stream_reader!r}",
                              "use auto, kernel or aiohttp")
        if self.api not in ENDPOINTS:
            raise ConfigError("api", f"unknown API {self.api!r}", "use 'completions' or 'chat'")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError("base_url", f"{self.base_url!r} is not an http(s) URL", "e.g. http://host:8000/v1")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINTS[self.api]

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h
