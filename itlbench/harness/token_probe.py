"""Does an OpenAI-compatible server take token-id prompts, and which ids?

vLLM and SGLang accept a list of token ids as `prompt` in `/v1/completions`; a prompt built from ids
has an exact length, with no tokenizer calibration. One tiny request (8 ids, 1 output token) tells
whether the server takes them: it must answer 200 and count exactly 8 prompt tokens. The usable ids
are then bounded by the server's own check: both engines refuse an id beyond their vocabulary with
a 400, so a search over single-id prompts finds the vocabulary size in about 20 requests of one
token. A server that accepts any id (no check) gives no bound, so its vocabulary stays unknown and
ids are not used.
"""

from __future__ import annotations

import json
import urllib.error
from dataclasses import dataclass
from typing import Any

from itlbench.harness.http_json import request_json

PROBE_LOW = 10  # ids below this are left out of prompts (special tokens of small vocabularies)
PROBE_IDS = tuple(range(PROBE_LOW, PROBE_LOW + 8))
SEARCH_CEILING = 1 << 20  # no tokenizer in use has a million ids


@dataclass(frozen=True)
class TokenIdSupport:
    """`accepted`: token-id prompts work, with ids in [PROBE_LOW, vocab_size). `reason` says why not."""

    accepted: bool
    vocab_size: int | None = None
    reason: str = ""
    probes: int = 0


class _Prober:
    def __init__(self, url: str, model: str, api_key: str | None, timeout_s: float) -> None:
        self.url, self.model, self.api_key, self.timeout_s = url, model, api_key, timeout_s
        self.calls = 0

    def send(self, ids: list[int]) -> tuple[int, dict[str, Any] | str]:
        """(HTTP status, reply JSON or error text) of a non-streaming 1-token completion."""
        self.calls += 1
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        try:
            return 200, request_json(self.url, body, self.api_key, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            text = exc.read(2000).decode(errors="replace")
            try:
                err = json.loads(text).get("error", text)
                text = err.get("message", text) if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                pass
            return exc.code, text.strip()[:300]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    def accepts(self, token_id: int) -> bool:
        return self.send([token_id])[0] == 200


def probe_token_ids(completions_url: str, model: str, api_key: str | None = None,
                    timeout_s: float = 60.0) -> TokenIdSupport:
    """Ask the server whether it takes token-id prompts and how many ids its vocabulary has."""
    p = _Prober(completions_url, model, api_key, timeout_s)
    status, reply = p.send(list(PROBE_IDS))
    if status != 200 or not isinstance(reply, dict):
        return TokenIdSupport(False, reason=f"a token-id prompt got HTTP {status}: {reply}", probes=p.calls)
    counted = (reply.get("usage") or {}).get("prompt_tokens")
    if counted != len(PROBE_IDS):
        return TokenIdSupport(False, reason=f"a prompt of {len(PROBE_IDS)} token ids was counted as "
                                            f"{counted} tokens", probes=p.calls)
    if p.accepts(SEARCH_CEILING - 1):
        return TokenIdSupport(False, reason=f"the server accepts token id {SEARCH_CEILING - 1}: it does not "
                                            "check ids against its vocabulary, so the usable ids are unknown",
                              probes=p.calls)
    lo, hi = PROBE_IDS[-1], SEARCH_CEILING - 1  # lo accepted, hi refused
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if p.accepts(mid) else (lo, mid)
    return TokenIdSupport(True, vocab_size=hi, probes=p.calls)
