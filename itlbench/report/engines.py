"""Which engine a run measured, and where its server-side figures came from.

The bundled engine and any itlbench server give a step log (every step's phase, tokens and time).
Other servers are recognised by the metric prefix their `/metrics` exposes (`vllm:`, `sglang:`, `llamacpp:`) or,
failing that, by the `owned_by` field of `/v1/models`; their split then comes from server counters,
or from nothing at all ("client only"), and every report row says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from itlbench.report.durations import fmt_s

PREFIX_ENGINES = {"vllm:": "vLLM", "sglang:": "SGLang", "llamacpp:": "llama.cpp server", "itlbench_": "itlbench server"}
OWNED_BY_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp server",
                    "llama.cpp": "llama.cpp server", "library": "Ollama", "ollama": "Ollama"}


def serving_warnings(doc: dict[str, Any]) -> list[str]:
    """What the engine warned of in run.json (a CPU engine on its slow path, a simulated load that keeps its
    phase): figures that do not mean what they seem, repeated after the terminal's tables and in the report."""
    engine = doc.get("engine") or {}
    engine = engine.get("itlbench", engine)  # an external itlbench server nests its /v1/engine
    return [str(w) for w in ((engine.get("serving") or {}).get("warnings") or [])]


@dataclass(frozen=True)
class EngineLabel:
    name: str  # e.g. "itlbench bundled (cpu-small)", "vLLM"
    external: bool
    source: str  # where server-side figures come from: step log, server counters, client only
    detected_from: str  # what told us the engine's name

    @property
    def has_steps(self) -> bool:
        return self.source.startswith("engine step log")


def metric_prefixes(server_metrics: pl.DataFrame) -> list[str]:
    if server_metrics.is_empty():
        return []
    names = server_metrics["name"].unique().to_list()
    return [p for p in PREFIX_ENGINES if any(str(n).startswith(p) for n in names)]


def detect_engine(doc: dict[str, Any], server_metrics: pl.DataFrame, steps: pl.DataFrame) -> EngineLabel:
    eng = doc.get("engine") or {}
    target = doc.get("target") or {}
    config = doc.get("config") or {}
    external = bool(eng.get("external")) or target.get("kind") == "external" or bool(config.get("endpoint"))
    has_steps = not steps.is_empty()
    prefixes = metric_prefixes(server_metrics)
    if not external:
        model = (eng.get("engine") or {}).get("model") or config.get("model") or "?"
        source = "engine step log" if has_steps else "client only (no step log was recorded)"
        return EngineLabel(f"itlbench bundled ({model})", False, source, "run.json (bundled engine)")
    if eng.get("itlbench"):
        served = eng["itlbench"] or {}
        model = (served.get("engine") or {}).get("model") or config.get("model") or "?"
        device = str(served.get("device") or "")
        what = f"{model}, simulated on {device}" if device.startswith("sim") else model  # times from the cost model
        name, found = f"itlbench server ({what})", "GET /v1/engine"
    elif prefixes:
        name, found = PREFIX_ENGINES[prefixes[0]], f"/metrics series prefix {prefixes[0]}"
    elif str(eng.get("owned_by") or "").lower() in OWNED_BY_ENGINES:
        name, found = OWNED_BY_ENGINES[str(eng["owned_by"]).lower()], "/v1/models owned_by"
    else:
        name, found = "unknown OpenAI-compatible server", "nothing identified it"
    if has_steps:
        source = "engine step log (itlbench server on the same host)"
    elif prefixes:
        source = "server counters (" + ", ".join(f"{p}* from /metrics" for p in prefixes) + ")"
    else:
        source = "client only (no step log, no engine /metrics)"
    return EngineLabel(name, True, source, found)


def engine_check_line(check: dict[str, Any]) -> str | None:
    """The engine cross-check in one line for the report and the terminal: the worst client gap against the
    engine time inside it, every duration as `fmt_s` writes it (a 4.4 ms gap is not "0.00 s")."""
    if check.get("longest_step_s") is None or check.get("worst_client_gap_s") is None:
        return None
    line = f"worst client gap {fmt_s(check['worst_client_gap_s'])}"
    if check.get("worst_gap_steps") is not None:
        n = check["worst_gap_steps"]
        line += (f" ({check['worst_gap_request_id']}): {n} engine step{'' if n == 1 else 's'} inside it kept the "
                 f"engine busy {fmt_s(check['worst_gap_engine_busy_s'])}, the longest "
                 f"{fmt_s(check.get('worst_gap_longest_step_s') or 0.0)}; "
                 f"{fmt_s(check['worst_gap_unexplained_s'])} not engine time")
    return line + f"; longest step of the run {fmt_s(check['longest_step_s'])}"
