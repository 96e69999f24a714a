"""Per-request state, torch-free: the scheduler only ever closes `num_tokens - num_computed_tokens`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from itlbench.errors import ConfigError


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


GREEDY_BELOW = 1e-5  # temperatures under this sample greedily (vLLM's _SAMPLING_EPS)


@dataclass
class SamplingParams:
    """Decoding controls. `ignore_eos`/`min_tokens` let benchmarks force exact output lengths."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # The client set no max_tokens (max_tokens is then the rest of the context): the response runs until the
    # model stops. A model decides that itself; the simulator, which never emits EOS otherwise, ends such a
    # response with EOS at a seeded, plausible length (sim/runner.py NATURAL_LENGTH) unless ignore_eos.
    open_ended: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ConfigError("max_tokens", f"must be > 0, got {self.max_tokens}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ConfigError("min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.temperature < 0:
            raise ConfigError("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p", f"must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        """Below GREEDY_BELOW the draw is the argmax anyway; dividing by such a temperature overflowed float32
        (1e-39 gave NaN probabilities and token id 0 every step)."""
        return self.temperature < GREEDY_BELOW


@dataclass
class Request:
    """One generation. Phase is emergent: prefill while more than one known token is uncomputed."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_ns: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at the latest admission
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the only uncomputed token is the last sampled one."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None

    def token_at(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    def token_slice(self, start: int, stop: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n:stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:stop - n]


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request: its new tokens and, at the end, why it stopped. Not
    changed once made; not frozen, as a step makes one per running request (see ScheduledChunk)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    time_ns: int = 0
