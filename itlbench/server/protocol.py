"""OpenAI request parsing and validation: JSON bodies in, a `GenerationRequest` or an `ApiError` out.

Every rejection names the offending field in `param` and in the message so load-test operators
can fix a client without reading server logs. Unknown fields are ignored, as OpenAI-compatible
servers commonly do; a known field this engine cannot honour (tools, response_format, penalties, ...)
is refused with a 400 naming it, unless its value is the one that changes nothing (`tools: []`,
`response_format: {"type": "text"}`, `presence_penalty: 0`, ...), which SDKs and harnesses send as defaults.

Chat template (documented, model-agnostic): each message renders as ``<|{role}|>\\n{content}\\n``
and the prompt ends with ``<|assistant|>\\n``; the result is tokenized like a completion prompt.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError

DEFAULT_COMPLETION_MAX_TOKENS = 16
# OpenAI's chat roles: "developer" is what its SDK and newer models send in place of "system", "function" the
# deprecated tool-result role; any other would render as a new tag.
CHAT_ROLES = ("developer", "system", "user", "assistant", "tool", "function")


@dataclass
class ApiError(Exception):
    """An OpenAI-shaped error response."""

    status: int
    message: str
    param: str | None = None
    type: str = "invalid_request_error"
    code: str | None = None
    request_id: str | None = None  # the generation request it ends, sent as the x-request-id header

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def bad_config(exc: ConfigError) -> ApiError:
    """The engine's refusal of a request's value as the client's 400, its fix kept (send ids below V, ...)."""
    return bad(exc.field, f"{exc.problem} ({exc.fix})" if exc.fix else exc.problem)


@dataclass
class GenerationRequest:
    """One validated completion or chat request, prompt not yet tokenized (unless given as ids)."""

    chat: bool
    model: str | None
    prompt: str | list[int]
    max_tokens: int | None  # None: chat default, the rest of the context
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool
    max_tokens_param: str = "max_tokens"
    max_tokens_defaulted: bool = False  # a completion's max_tokens is OpenAI's default (16), not the client's
    include_stop_str_in_output: bool = False  # vLLM's: the stop string's (stop token's, EOS's) text stays in the output
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage): usage on every chunk
    stop: tuple[str, ...] = ()  # OpenAI's stop strings (server/stop_strings.py)

    @property
    def prompt_param(self) -> str:
        return "messages" if self.chat else "prompt"

    def sampling(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(max_tokens=max_tokens, min_tokens=self.min_tokens,
                                  temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                  ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids,
                                  open_ended=self.max_tokens is None)
        except ConfigError as exc:
            raise bad_config(exc) from exc


def prompt_ids(tokenizer: Any, req: GenerationRequest) -> list[int]:
    """The prompt as token ids: text tokenized, ids checked against the vocabulary (a 400 naming the fix)."""
    if isinstance(req.prompt, str):
        ids = tokenizer.encode(req.prompt)
        if not ids:
            raise bad(req.prompt_param, "tokenizes to zero tokens (send a non-empty prompt)")
        return ids
    vocab = tokenizer.vocab_size
    for tok in req.prompt:
        if not 0 <= tok < vocab:
            raise bad(req.prompt_param, f"token id {tok} is outside the vocabulary [0, {vocab}) (send ids below {vocab})")
    return req.prompt


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body: malformed JSON ({exc})", "body") from exc
    except RecursionError as exc:  # valid JSON, but nested past the parser's stack: the client's 400, not a 500
        raise ApiError(400, "body: JSON nested too deeply", "body") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "body: expected a JSON object", "body")
    if (field := _lone_surrogate(body)) is not None:
        raise bad(field, "holds a lone UTF-16 surrogate (e.g. \\ud800), which is not text; send valid Unicode")
    return body


def _lone_surrogate(body: Any) -> str | None:
    """The field path of the first string JSON decoded with a lone surrogate: valid JSON, but no text can be
    tokenized or echoed from it, so it is the client's 400, never the server's 500. Walked with a stack, not
    by recursion, which a body nested a thousand deep (that parses) would exhaust."""
    stack: list[tuple[str, str | int | None, Any]] = [("", None, body)]  # (parent's path, key or index, value)
    while stack:
        parent, key, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return _field_path(parent, key) or "body"
            continue
        if isinstance(value, dict):
            children: Any = value.items()
        elif isinstance(value, list) and not (value and isinstance(value[0], int)):  # ints: a token-id prompt
            children = enumerate(value)
        else:
            continue
        where = _field_path(parent, key)
        stack.extend(reversed([(where, k, v) for k, v in children]))  # reversed: popped in document order
    return None


def _field_path(parent: str, key: str | int | None) -> str:
    if key is None:
        return parent
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def parse_completion(body: dict[str, Any]) -> GenerationRequest:
    return _parse_common(body, chat=False, prompt=_completion_prompt(body))


def parse_chat(body: dict[str, Any]) -> GenerationRequest:
    req = _parse_common(body, chat=True, prompt=render_chat(body.get("messages")))
    mct = _opt_int(body, "max_completion_tokens")
    if mct is not None:
        _check_positive("max_completion_tokens", mct)
        req.max_tokens, req.max_tokens_param = mct, "max_completion_tokens"
    return req


def render_chat(messages: Any) -> str:
    """The documented template; content may be a string or a list of text parts."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {role, content} objects")
    parts = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise bad(f"messages[{i}].role", "each message needs a string role")
        if msg["role"] not in CHAT_ROLES:
            raise bad(f"messages[{i}].role", f"{msg['role'][:40]!r} is not a role; use one of {', '.join(CHAT_ROLES)}")
        parts.append(f"<|{msg['role']}|>\n{_content_text(msg.get('content'), i)}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _content_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content", "only text parts ({type: text, text}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content", "must be a string or a list of text parts")


def _completion_prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad("prompt", f"batched prompts are not supported (got {len(prompt)}); send one per request")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "must not be empty")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise bad("prompt", "must not be empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad("prompt", "a token-id prompt must be a list of integers")
        return list(prompt)
    raise bad("prompt", "must be a string, a list of token ids, or a one-element list of either")


def _parse_common(body: dict[str, Any], *, chat: bool, prompt: str | list[int]) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "must be a string")
    _reject_unsupported(body)
    max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is not None:
        _check_positive("max_tokens", max_tokens)
    defaulted = max_tokens is None and not chat
    if defaulted:
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
    stream = _opt_bool(body, "stream", False)
    include_usage, continuous = _stream_options(body, stream)
    return GenerationRequest(
        chat=chat, model=model, prompt=prompt, max_tokens=max_tokens, max_tokens_defaulted=defaulted,
        min_tokens=_opt_int(body, "min_tokens") or 0,
        temperature=_opt_float(body, "temperature", 1.0), top_p=_opt_float(body, "top_p", 1.0),
        seed=_seed(body), ignore_eos=_opt_bool(body, "ignore_eos", False),
        stop_token_ids=_token_ids(body, "stop_token_ids"), stream=stream,
        include_usage=include_usage, continuous_usage=continuous,
        include_stop_str_in_output=_opt_bool(body, "include_stop_str_in_output", False),
        stop=_stop_strings(body))


def _reject_unsupported(body: dict[str, Any]) -> None:
    n = _opt_int(body, "n")
    if n is not None and n != 1:
        raise bad("n", f"only n=1 is supported, got {n}")
    best_of = _opt_int(body, "best_of")
    if best_of is not None and best_of != 1:
        raise bad("best_of", f"only best_of=1 is supported, got {best_of}")
    if body.get("echo"):
        raise bad("echo", "echo is not supported")
    logprobs = body.get("logprobs")  # 0 on /v1/completions asks for the sampled token's own (0 == False in Python)
    if logprobs is not None and logprobs is not False:
        raise bad("logprobs", "logprobs are not supported")
    if body.get("top_logprobs") is not None:  # named itself: a client may send it without logprobs
        raise bad("top_logprobs", "logprobs are not supported")
    if body.get("prompt_logprobs") is not None:
        raise bad("prompt_logprobs", "logprobs are not supported")
    for name, neutral in _NEUTRAL_NUMBERS.items():
        value = _opt_float(body, name, neutral)
        if value != neutral and not (name == "top_k" and value in (-1, 0)):
            raise bad(name, f"is not implemented by this engine (got {value:g}); leave it out or send {neutral:g}")
    for name in _EMPTY_OR_ABSENT:
        if body.get(name) not in (None, [], {}, ""):
            raise bad(name, f"{_WHAT[name]} not supported by this engine; leave it out")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none", "auto"):
            raise bad(name, "tool calls are not supported by this engine; leave it out (or send none)")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format", "structured output is not supported by this engine; leave it out or send "
                  '{"type": "text"}')
    if body.get("use_beam_search"):
        raise bad("use_beam_search", "beam search is not supported by this engine")


# Fields this engine does not implement, refused unless they hold the value that changes nothing (top_k:
# also -1 or 0, vLLM's "all tokens"); json null counts as absent everywhere.
_NEUTRAL_NUMBERS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                    "length_penalty": 1.0, "top_k": -1.0, "min_p": 0.0}
_WHAT = {"tools": "tool calls are", "functions": "function calls are", "logit_bias": "logit_bias is",
         "suffix": "suffix (fill-in-the-middle) is", "allowed_token_ids": "allowed_token_ids is",
         "bad_words": "bad_words is", "guided_json": "guided decoding is", "guided_regex": "guided decoding is",
         "guided_choice": "guided decoding is", "guided_grammar": "guided decoding is",
         "structured_outputs": "structured output is"}
_EMPTY_OR_ABSENT = tuple(_WHAT)


# OpenAI takes up to 4 stop strings; vLLM any number of any length. Clients written for vLLM may send more than
# 4, so the caps are looser than OpenAI's, there only to bound the matching the event loop does for each token
# of each stream (stop_strings.py): at 16 x 256 characters ~4 us a token (~14 us on text built to defeat it),
# against ~1.5 us for one short string; at 64 x 1024, 35-100 us.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """`stop`: a string or a list of strings; null, "" and [] send none."""
    value = body.get("stop")
    if value is None or value == "":
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("stop", f"must be a string or a list of strings, got {json.dumps(value)[:80]}")
    if len(items) > MAX_STOP_STRINGS:
        raise bad("stop", f"{len(items)} stop strings; send at most {MAX_STOP_STRINGS}")
    for i, s in enumerate(items):
        if not s:
            raise bad("stop", f"stop[{i}] is an empty string, which would match everywhere; leave it out")
        if len(s) > MAX_STOP_CHARS:
            raise bad("stop", f"stop[{i}] is {len(s)} characters; send at most {MAX_STOP_CHARS}")
    return tuple(items)


def _stream_options(body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of stream_options; the second only counts with the first, as in vLLM."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    if not isinstance(opts, dict):
        raise bad("stream_options", "must be an object")
    if not stream:
        raise bad("stream_options", "only allowed when stream is true")
    include = _opt_bool(opts, "include_usage", False, prefix="stream_options.")
    return include, include and _opt_bool(opts, "continuous_usage_stats", False, prefix="stream_options.")


SEED_RANGE = (-(2**63), 2**63 - 1)  # a signed 64-bit integer, as OpenAI's and vLLM's


def _seed(body: dict[str, Any]) -> int | None:
    """`seed`, refused outside 64 bits (as vLLM does), where the sampler's seed arithmetic made, say, 2**64 draw
    exactly what seed 0 draws."""
    seed = _opt_int(body, "seed")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise bad("seed", f"must be a signed 64-bit integer, in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
    return seed


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise bad(name, f"must be >= 1, got {value}")


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"must be an integer, got {json.dumps(value)}")
    return value


def _opt_float(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, f"must be a number, got {json.dumps(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):  # json.loads takes NaN and Infinity; sampling with them is undefined
        raise bad(name, f"must be a finite number, got {value}")
    return out


def _opt_bool(body: dict[str, Any], name: str, default: bool, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(prefix + name, f"must be a boolean, got {json.dumps(value)}")
    return value


def _token_ids(body: dict[str, Any], name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad(name, "must be a list of integers")
    return tuple(value)
