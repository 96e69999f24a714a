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


@dataclass(frozen=True)
class SessionPlan:
    """A multi-turn session that arrives open-loop and then runs its turns closed-loop: the first turn is
    sent at `arrive_at_s` (seconds after measurement starts), each later one once the turn before it has
    answered plus its think time, as an agent loop can only send its next prompt after reading the answer.
    Its turns carry `stream`, an index of its own (after the run's closed-loop streams), so per-stream
    analysis sees each session as one stream."""

    arrive_at_s: float
    stream: int
    turns: Iterator[RequestPlan]


@dataclass
class LoadPlan:
    """Everything a run sends: per-stream closed-loop iterators, one time-ordered open-loop feed, and one
    time-ordered feed of arriving sessions (each then closed-loop)."""

    streams: list[Iterator[RequestPlan]] = field(default_factory=list)
    open_loop: Iterator[RequestPlan] = field(default_factory=lambda: iter(()))
    description: dict[str, object] = field(default_factory=dict)
    sessions: Iterator[SessionPlan] = field(default_factory=lambda: iter(()))
