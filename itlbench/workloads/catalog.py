"""The workload catalog: named length mixes, so runs are comparable by name alone."""

from __future__ import annotations

from dataclasses import dataclass

from itlbench.errors import ConfigError
from itlbench.units import parse_tokens


@dataclass(frozen=True)
class SharedPrefix:
    """A pool of documents that requests prepend, so prefix caching has something to hit."""

    num_documents: int
    prefix_tokens: int  # mean document length; the unique question is mean_in - prefix_tokens
    prefix_sigma: float = 0.3


@dataclass(frozen=True)
class Sessions:
    """Multi-turn sessions: each turn's prompt is the previous prompt + its output + a tool result."""

    min_turns: int
    max_turns: int
    initial_tokens: int  # mean first-turn context
    tool_result_tokens: int  # mean tokens a tool adds between turns
    think_time_mean_s: float  # exponential tool/think time before each later turn


@dataclass(frozen=True)
class WorkloadSpec:
    """One catalog entry. Lengths are lognormal with these means (sigma in log space)."""

    name: str
    mean_in: int
    mean_out: int
    sigma: float
    description: str
    shared_prefix: SharedPrefix | None = None
    sessions: Sessions | None = None
    from_trace: bool = False


def _entries() -> list[WorkloadSpec]:
    return [
        WorkloadSpec("chat-short", 50, 300, 0.6, "short questions, long answers"),
        WorkloadSpec("chat", 500, 500, 0.6, "balanced chat turns"),
        WorkloadSpec(
            "rag", 8000, 400, 0.3, "shared document prefixes + unique questions",
            shared_prefix=SharedPrefix(num_documents=8, prefix_tokens=7800),
        ),
        WorkloadSpec("summarization", 32000, 500, 0.25, "very long inputs"),
        WorkloadSpec("code", 2000, 50, 0.5, "completion: long context, short output"),
        WorkloadSpec(
            "agent", 4000, 100, 0.4,
            "multi-turn sessions, growing context, tool think-time, prefix reuse",
            sessions=Sessions(min_turns=3, max_turns=8, initial_tokens=2500,
                              tool_result_tokens=500, think_time_mean_s=1.0),
        ),
        WorkloadSpec("trace", 0, 0, 0.0, "replay of a trace (Azure CSV, BurstGPT CSV, Mooncake JSONL), time-scalable",
                     from_trace=True),
    ]


CATALOG: dict[str, WorkloadSpec] = {spec.name: spec for spec in _entries()}


FIXED_PREFIX = "fixed:"
MAX_FIXED_TOKENS = 1 << 24  # 16M tokens: past every model's context, and still exact in a float


def fixed_workload(name: str) -> WorkloadSpec:
    """`fixed:IN:OUT`: every prompt exactly IN tokens and every output exactly OUT (with forced lengths),
    the shape of `vllm bench`'s random dataset at zero range, for reproducing published latency tables."""
    parts = name[len(FIXED_PREFIX):].split(":")
    fix = "e.g. --workload fixed:2048:128 or fixed:4k:1k (k = 1024 tokens)"
    if len(parts) != 2:
        raise ConfigError("--workload", f"'{name}' is not fixed:IN:OUT with two positive token counts", fix)
    try:
        mean_in, mean_out = (parse_tokens(p, "--workload", fix) for p in parts)
    except ConfigError:
        raise ConfigError("--workload", f"'{name}' is not fixed:IN:OUT with two positive token counts",
                          fix) from None
    if max(mean_in, mean_out) > MAX_FIXED_TOKENS:
        raise ConfigError("--workload", f"'{name}' asks for more than {MAX_FIXED_TOKENS:,} tokens",
                          "give lengths within the model's context, e.g. fixed:2048:128")
    return WorkloadSpec(name, mean_in, mean_out, 0.0, f"every prompt {mean_in} tokens, every output {mean_out}")


def get_workload(name: str) -> WorkloadSpec:
    """Look a workload up by name (or `fixed:IN:OUT`); unknown names get the list of valid ones."""
    if name.startswith(FIXED_PREFIX):
        return fixed_workload(name)
    try:
        return CATALOG[name]
    except KeyError:
        raise ConfigError("--workload", f"unknown workload '{name}'",
                          f"use one of {', '.join(CATALOG)}, or fixed:IN:OUT") from None


def _notes(spec: WorkloadSpec) -> str:
    notes = [spec.description]
    if spec.shared_prefix:
        sp = spec.shared_prefix
        notes.append(f"{sp.num_documents} docs of ~{sp.prefix_tokens} tokens")
    if spec.sessions:
        s = spec.sessions
        notes.append(f"{s.min_turns}-{s.max_turns} turns, think ~{s.think_time_mean_s:g} s")
    if not spec.from_trace:
        notes.append(f"lognormal sigma {spec.sigma:g}")
    return "; ".join(notes)


def catalog_table() -> list[tuple[str, str, str, str, str]]:
    """Rows (name, mean in, mean out, in:out, notes) for `itlbench workloads`."""
    rows = []
    for spec in CATALOG.values():
        if spec.from_trace:
            rows.append((spec.name, "from trace", "from trace", "from trace", _notes(spec)))
            continue
        per_turn = " per turn" if spec.sessions else ""
        rows.append((spec.name, str(spec.mean_in), str(spec.mean_out),
                     f"{spec.mean_in}:{spec.mean_out}{per_turn}", _notes(spec)))
    return rows
