"""The contract between workloads (which say what to send, and when) and the load driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestPlan:
    """One request to send. Open-loop plans carry `send_at_s`; closed-loop ones are sent when
    their stream is free, after `think_time_s`."""

    request_id: str
    workload: str
    cls: str  # SLO class: the workload name, or "injected"
    prompt_tokens: int
    max_tokens: int
    prompt_token_ids: tuple[int, ...] | None = None  # exact ids, for servers that take token-id prompts
    prompt_text: str | None = None  # for servers that only take text
    injected: bool = False
    send_at_s: float | None = None  # seconds after the run starts (open loop); None = closed loop
    stream: int | None = None
    session: str | None = None
    turn: int = 0
    think_time_s: float = 0.0


@dataclass
class LoadPlan:
    """Everything a run sends: per-stream closed-loop iterators and one time-ordered open-loop feed."""

    streams: list[Iterator[RequestPlan]] = field(default_factory=list)
    open_loop: Iterator[RequestPlan] = field(default_factory=lambda: iter(()))
    description: dict[str, object] = field(default_factory=dict)
