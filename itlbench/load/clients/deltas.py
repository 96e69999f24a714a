"""What a streamed choice carries, whatever field it arrives in.

Servers stream more than `delta.content`: reasoning models send `delta.reasoning` (vLLM ≥ 0.10) or
`delta.reasoning_content` (older vLLM, SGLang, DeepSeek's API) before the answer; tool calls arrive as
`delta.tool_calls` fragments; some servers send `content` as a list of parts. A harness that counts only
`content` starts TTFT late and misses gaps, so every one of these counts as a token chunk, labelled
`reasoning` or `answer` so that TTFT to the first answer token and each phase's ITL can be told apart.
"""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["answer", "reasoning"]
REASONING_FIELDS = ("reasoning", "reasoning_content")


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return any(isinstance(p, dict) and _has_text(p.get("text")) for p in value)
    return False


def delta_kind(delta: Any) -> Kind | None:
    """`answer` for content or tool-call fragments, `reasoning` for reasoning text, None for a chunk
    that carries no token (role-only, finish-only, empty)."""
    if not isinstance(delta, dict):
        return None
    if _has_text(delta.get("content")):
        return "answer"
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and any(isinstance(c, dict) for c in calls):
        return "answer"
    if any(_has_text(delta.get(f)) for f in REASONING_FIELDS):
        return "reasoning"
    return None


def logprob_tokens(choice: dict[str, Any]) -> int:
    """Tokens a choice's `logprobs` lists (chat and llama.cpp: `content` entries; legacy completions:
    `tokens`), 0 when absent. Servers that hold back a token whose bytes end mid-character (llama.cpp)
    send it inside the next chunk: only the logprobs say that chunk carried two."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return 0
    entries = lp.get("content")
    if not isinstance(entries, list):
        entries = lp.get("tokens")
    return len(entries) if isinstance(entries, list) else 0


def choice_kind(choice: dict[str, Any]) -> Kind | None:
    """A completions choice (`text`) or a chat choice (`delta`)."""
    if _has_text(choice.get("text")):
        return "answer"
    return delta_kind(choice.get("delta"))
