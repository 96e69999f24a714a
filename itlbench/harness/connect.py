"""Reach the server a run measures: start the bundled engine, or probe an external endpoint.

An external itlbench server on this host is measured like the bundled one (token-id prompts and
its step log; both share CLOCK_MONOTONIC). Any other server gets token-id prompts when it takes them
(`--prompt-format auto`: one probe request, see token_probe.py; `ids` insists), else text prompts
whose length is calibrated against its own `usage.prompt_tokens`; its `/metrics` is read.
"""

from __future__ import annotations

import ipaddress
import json
import ssl
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.harness.bundled_server import BundledServer
from itlbench.harness.http_json import CONTROL_REPLY_BYTES, NotJson, request_json
from itlbench.harness.run_config import RunConfig
from itlbench.harness.token_probe import PROBE_LOW, probe_token_ids
from itlbench.load.clients.sse import error_text
from itlbench.load.target import Target
from itlbench.rundir.coerce import as_count
from itlbench.workloads.prompts import PromptBuilder

CALIBRATION_TOKENS = 512
DEFAULT_EXTERNAL_CONTEXT = 131_072


@dataclass
class Connection:
    target: Target
    max_model_len: int
    vocab_size: int | None  # None: text prompts
    steps_url: str | None  # an itlbench engine's /v1 base whose step log to follow
    metrics_url: str | None  # an external engine's /v1 base whose /metrics to sample
    tokens_per_word: float = 1.0
    server: BundledServer | None = None
    doc: dict[str, Any] = field(default_factory=dict)

    def close(self) -> int | None:
        """Stop a bundled server; its exit code when it died on its own, None when it was alive and stopped
        cleanly. One that exits non-zero when told to stop was dying already: its engine died as the run
        ended (failures in a row can end it before the server has finished exiting)."""
        if self.server is None:
            return None
        code = self.server.process.poll() if self.server.process else None
        stopped = self.server.stop()
        return code if code is not None else (stopped if stopped is not None and stopped > 0 else None)


def connect(cfg: RunConfig, run_dir: Path) -> Connection:
    return _bundled(cfg, run_dir) if cfg.endpoint is None else _external(cfg)


def _bundled(cfg: RunConfig, run_dir: Path) -> Connection:
    server = BundledServer(cfg.engine, run_dir / "server.log", otlp_endpoint=cfg.otlp_endpoint)
    try:
        server.start()
    except ItlbenchError as exc:
        raise _refused_by_server(server) or exc from None
    info = server.engine_info
    target = Target(base_url=server.base_url, model=str(info["served_model_name"]), api=cfg.api,
                    accepts_token_ids=True, forced_lengths=True, timeout_s=cfg.request_timeout_s,
                    stream_reader=cfg.stream_reader, max_event_bytes=cfg.limits.event_bytes,
                    max_head_bytes=cfg.limits.head_bytes)
    doc = {"engine": info, "target": {"kind": "bundled", "base_url": server.base_url,
                                      "server_pid": server.process.pid if server.process else None}}
    return Connection(target, int(info["max_model_len"]), int(info["model"]["vocab_size"]),
                      steps_url=server.base_url, metrics_url=None, server=server, doc=doc)


def _refused_by_server(server: BundledServer) -> ItlbenchError | None:
    """The server's own one-line refusal where it exited 2 with one and no traceback (an engine flag only the engine
    can judge, e.g. a K/V pool too large for the memory it finds): the line alone, not the log's tail around it."""
    if server.process is None or server.process.poll() != 2:
        return None
    lines = [line for line in server.tail_log().splitlines() if line.strip()]
    if not lines or not lines[-1].startswith("error: ") or any(line.startswith("Traceback") for line in lines):
        return None
    return ItlbenchError(lines[-1].removeprefix("error: "))


def _external(cfg: RunConfig) -> Connection:
    assert cfg.endpoint is not None
    base = cfg.endpoint.rstrip("/")
    models = _probe_models(cfg, base)
    engine = _get_json(f"{base}/engine", cfg.api_key, max_bytes=cfg.limits.control_bytes)  # only itlbench servers
    same_clock = engine is not None and _is_loopback(base)
    max_len = (as_count((engine or {}).get("max_model_len")) or models.get("max_model_len")
               or DEFAULT_EXTERNAL_CONTEXT)
    doc: dict[str, Any] = {"engine": {"external": True, **models, **({"itlbench": engine} if engine else {})},
                           "target": {"kind": "external", "base_url": base}}
    vocab = _token_id_vocab(cfg, base, models["model"], engine if same_clock else None, doc)
    target = Target(base_url=base, model=models["model"], api=cfg.api, api_key=cfg.api_key,
                    accepts_token_ids=vocab is not None, forced_lengths=cfg.forced_lengths,
                    timeout_s=cfg.request_timeout_s, stream_reader=cfg.stream_reader,
                    max_event_bytes=cfg.limits.event_bytes, max_head_bytes=cfg.limits.head_bytes,
                    extra_body=dict(cfg.extra_body))
    steps_url = base if same_clock else None
    if engine is None:  # an itlbench server serves both APIs and its listed model
        check_api(target)
    if vocab is not None:
        return Connection(target, max_len, vocab, steps_url=steps_url, metrics_url=base, doc=doc)
    tpw = calibrate_text(target)
    doc["engine"]["tokens_per_word"] = tpw
    return Connection(target, max_len, None, steps_url=steps_url, metrics_url=base, tokens_per_word=tpw, doc=doc)


def _token_id_vocab(cfg: RunConfig, base: str, model: str, itlbench_engine: dict[str, Any] | None,
                    doc: dict[str, Any]) -> int | None:
    """The vocabulary size to draw prompt ids from, or None for text prompts (`--prompt-format`)."""
    fmt = cfg.prompt_format
    if fmt == "text" or cfg.api == "chat":  # chat messages are text
        doc["prompt_format"] = {"requested": fmt, "used": "text"}
        return None
    if itlbench_engine is not None:  # an itlbench server on this host says its vocabulary itself
        doc["prompt_format"] = {"requested": fmt, "used": "ids", "source": "GET /v1/engine"}
        return int(itlbench_engine["model"]["vocab_size"])
    support = probe_token_ids(f"{base}/completions", model, cfg.api_key)
    doc["prompt_format"] = {"requested": fmt, "used": "ids" if support.accepted else "text",
                            "vocab_size": support.vocab_size, "probe_requests": support.probes,
                            "ids_from": PROBE_LOW, "reason": support.reason or None}
    if support.accepted:
        return support.vocab_size
    if fmt == "ids":
        raise ConfigError("--prompt-format", f"{base} does not take token-id prompts: {support.reason}",
                          "use --prompt-format text (or auto, which falls back to text)")
    return None


def calibrate_text(target: Target) -> float:
    """Tokens per word of the server's tokenizer for itlbench's text prompts, from one request."""
    text = PromptBuilder(token_ids=False, seed=12345).unique("calibration", CALIBRATION_TOKENS).text or ""
    body: dict[str, Any] = {"model": target.model, "max_tokens": 1, "temperature": 0.0}
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    reply = _post_json(target.url, body, target.api_key)
    used = ((reply or {}).get("usage") or {}).get("prompt_tokens")
    if not isinstance(used, int) or used <= 0:
        return 1.0  # the server reports no usage: keep the one-token-per-word estimate
    return used / CALIBRATION_TOKENS


def _probe_models(cfg: RunConfig, base: str) -> dict[str, Any]:
    """GET /v1/models: fail early, naming the flag, when the endpoint or the model is wrong."""
    try:
        models = _get_json(f"{base}/models", cfg.api_key, raise_errors=True, max_bytes=cfg.limits.control_bytes) or {}
    except Exception as exc:  # noqa: BLE001 - any failure means the endpoint is unusable
        if _untrusted_certificate(exc):
            raise ConfigError("--endpoint", f"{base}'s TLS certificate was not trusted ({_ssl_reason(exc)})",
                              "trust its CA with SSL_CERT_FILE=/path/ca.pem") from None
        if isinstance(exc, NotJson):  # a web page, a proxy's error text: not an OpenAI-compatible API
            raise ConfigError("--endpoint", f"{base}/models answered something that is not JSON "
                              f"({exc.content_type}: {exc.head!r})", "point --endpoint at an OpenAI-compatible "
                              "base URL ending in /v1, e.g. http://localhost:8000/v1") from None
        if isinstance(exc, urllib.error.HTTPError) and exc.code in (401, 403):
            raise ConfigError("--endpoint", f"GET {base}/models failed: {exc}",
                              "set ITLBENCH_API_KEY in the environment to the server's key") from None
        raise ConfigError("--endpoint", f"GET {base}/models failed: {exc}",
                          "check the URL ends in /v1 and the server is up") from None
    data = models.get("data")  # the reply is untrusted: entries that are not objects with a str id are skipped
    entries = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else []
    ids = [m["id"] for m in entries]
    model = cfg.model or _only_model(ids, base)
    if ids and model not in ids:
        raise ConfigError("--model", f"{model!r} is not served at {base}", f"served: {', '.join(ids)}")
    entry = next((m for m in entries if m.get("id") == model), {})
    owner = entry.get("owned_by")
    return {"models": ids, "model": model, "max_model_len": entry_max_len(entry),
            **({"model_from": "the only model GET /v1/models lists"} if not cfg.model else {}),
            **({"owned_by": owner} if isinstance(owner, str) and owner else {})}


def _untrusted_certificate(exc: BaseException) -> bool:
    """A TLS verify failure (self-signed or private CA): the fix is to trust its CA, not to check the URL."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, ssl.SSLCertVerificationError)


def _ssl_reason(exc: BaseException) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return str(getattr(reason, "verify_message", None) or reason)


def check_api(target: Target) -> None:
    """One tiny request to the URL the load will use: a 404 there (a chat-only server asked for completions, or
    a model /v1/models lists but the server does not serve) is bad input, refused before any run directory."""
    status, text = _post_status(target.url, _tiny_body(target.model, target.api), target.api_key)
    if status != 404:
        return
    other = "chat" if target.api == "completions" else "completions"
    other_url = target.url.rsplit("/", 2 if target.api == "chat" else 1)[0] + (
        "/chat/completions" if other == "chat" else "/completions")
    if _post_status(other_url, _tiny_body(target.model, other), target.api_key)[0] not in (0, 404):
        raise ConfigError("--api", f"POST {target.url} answered HTTP 404: {text}",
                          f"this server answers {other_url}: use --api {other}")
    raise ConfigError("--model", f"POST {target.url} for model {target.model!r} answered HTTP 404: {text}",
                      "check --api and give a model this server generates with via --model")


def _tiny_body(model: str, api: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0.0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return body


def _post_status(url: str, body: dict[str, Any], api_key: str | None) -> tuple[int, str]:
    """(HTTP status, the error body's message as `error_text` words it); 0 when nothing answered."""
    try:
        request_json(url, body, api_key, timeout=120)
    except urllib.error.HTTPError as exc:
        return exc.code, error_text(exc.code, exc.read(4096), exc.headers.get("Content-Type")).partition(": ")[2]
    except (urllib.error.URLError, OSError, ValueError):
        return 0, ""
    return 200, ""


def _only_model(ids: list[str], base: str) -> str:
    """The model to ask for when --model is left out: the one a server lists (as vLLM's `bench serve` does), since
    guessing among several would measure one the user did not mean."""
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise ConfigError("--model", f"GET {base}/models lists no model to ask for",
                          "give the served model name with --model")
    shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    raise ConfigError("--model", f"{base} serves {len(ids)} models", f"choose one with --model: {shown}")


def entry_max_len(entry: dict[str, Any]) -> int | None:
    """A /v1/models entry's context length: vLLM's `max_model_len`, else llama.cpp's `meta.n_ctx` (one
    slot's context: `-c`, or `-c / -np` without --kv-unified; not `n_ctx_train`, the model's own)."""
    meta = entry.get("meta")
    return as_count(entry.get("max_model_len")) or (as_count(meta.get("n_ctx")) if isinstance(meta, dict) else None) \
        or None


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _get_json(url: str, api_key: str | None, raise_errors: bool = False,
              max_bytes: int = CONTROL_REPLY_BYTES) -> dict[str, Any] | None:
    try:
        return request_json(url, api_key=api_key, max_bytes=max_bytes)
    except (urllib.error.URLError, OSError, json.JSONDecodeError, ValueError):
        if raise_errors:
            raise
        return None


def _post_json(url: str, body: dict[str, Any], api_key: str | None) -> dict[str, Any] | None:
    try:
        return request_json(url, body, api_key, timeout=120)
    except (urllib.error.URLError, OSError, json.JSONDecodeError, ValueError):
        return None
