"""OpenAI response and stream-chunk bodies for completions and chat completions.

Choices carry a non-standard `token_ids` list (like vLLM's `return_token_ids`) so clients count
tokens exactly even when byte-level text for a token is empty or held back mid-character. A response
that a stop token or EOS ended lists that token in `token_ids` (and counts it in usage) but leaves its
text out, as vLLM does unless `include_stop_str_in_output`; one that a stop string ended lists the tokens
up to the one that completed it, and its text ends before the string (after it, with that flag).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` (prompt tokens served from the
    prefix cache, as OpenAI and vLLM report them) when the engine says."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


@dataclass
class ResponseBuilder:
    """Builds the bodies of one response; `chat` picks the chat or the text-completion shape."""

    request_id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def chunk(self, text: str, token_ids: list[int], finish_reason: str | None,
              stop_reason: int | str | None = None, usage_now: dict[str, Any] | None = None) -> dict[str, Any]:
        """One streamed step; the last carries `finish_reason` and vLLM's `stop_reason` (the stop token id or
        stop string that ended it, null for EOS); `usage_now`: the usage so far (continuous_usage_stats)."""
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": finish_reason, "token_ids": token_ids}
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "token_ids": token_ids}
            body = self._envelope("text_completion", [choice])
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if usage_now is not None:
            body["usage"] = usage_now
        return body

    def role_chunk(self, usage_now: dict[str, Any] | None = None) -> dict[str, Any]:
        """Chat streams open with the assistant role and no content, as OpenAI's do."""
        choice = {"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
        body = self._envelope("chat.completion.chunk", [choice])
        if usage_now is not None:
            body["usage"] = usage_now
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int | None = None) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body

    def full(self, text: str, token_ids: list[int], finish_reason: str | None,
             prompt_tokens: int, cached_tokens: int | None = None,
             stop_reason: int | str | None = None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason, "stop_reason": stop_reason, "token_ids": token_ids}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": stop_reason, "token_ids": token_ids}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage(prompt_tokens, len(token_ids), cached_tokens)
        return body
