"""`Engine`: the synchronous core. Each `step()` is schedule → run → commit.

"Run" belongs to a `Runner`: the torch model runner (`itlbench.engine.runner`) flattens the chunks,
runs the model and samples; the simulated runner (`itlbench.sim.runner`) charges the step's roofline
cost to a virtual clock and makes up tokens. Both sit under the same scheduler and block manager, and
the engine stamps every time through the runner's clock, so a simulated step log is a step log.
Nothing here imports torch; `itlbench.serving.build` picks and builds the runner.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from itlbench.core.block_manager import BlockManager
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.nvtx import nvtx_range
from itlbench.core.presets import load_model_config
from itlbench.core.request import Request, RequestOutput, SamplingParams
from itlbench.core.scheduler import Scheduler
from itlbench.core.scheduler_output import SchedulerOutput
from itlbench.core.steps import StepLog, StepRecord
from itlbench.core.tokenizer import Tokenizer, load_tokenizer
from itlbench.errors import ConfigError


class StepClock(Protocol):
    """Where the engine's timestamps come from (perf_counter_ns domain for served engines)."""

    def now_ns(self) -> int: ...

    def end_step(self, start_ns: int) -> int:
        """Called once the step's work is done; returns its end time (may wait for it)."""
        ...


class WallClock:
    """The real engine's clock: a step ends when its work does."""

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def end_step(self, start_ns: int) -> int:
        return time.perf_counter_ns()


@dataclass(slots=True)
class StepRun:
    """What one `Runner.run` produced: a token per request that sampled, and where the time went
    (prepare/forward/sample; a runner that does not split its work leaves them 0: all is forward)."""

    tokens: dict[str, int]
    prepare_ns: int = 0
    forward_ns: int = 0
    sample_ns: int = 0
    cuda_graph: bool = False


@dataclass(frozen=True)
class RunnerInfo:
    """What a runner is, for /v1/engine, run.json and the report: the resolved device, dtype and
    kernels (auto settings resolved to what actually runs)."""

    device: str
    dtype: str
    attention: str
    block_size: int
    decode_kernel: str | None = None
    weight_layout: str | None = None
    warnings: tuple[str, ...] = field(default=())


class Runner(Protocol):
    """Executes one scheduled step; owns the KV cache's size and the clock steps are stamped by."""

    clock: StepClock
    num_blocks: int

    @property
    def info(self) -> RunnerInfo: ...

    def run(self, output: SchedulerOutput, label: str) -> StepRun: ...


class SteppedEngine(Protocol):
    """The surface a serving driver steps: `Engine`, or `itlbench.sim.disagg.DisaggEngine` (two pools)."""

    config: EngineConfig
    model_config: ModelConfig
    max_model_len: int
    tokenizer: Tokenizer
    block_manager: BlockManager
    step_log: StepLog
    clock: StepClock
    device: str
    dtype: str

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def runner_info(self) -> RunnerInfo: ...

    def add_request(self, prompt: str | Sequence[int], sampling: SamplingParams, request_id: str | None = None,
                    arrival_ns: int | None = None) -> Request: ...

    def abort(self, request_id: str) -> bool: ...

    def has_unfinished(self) -> bool: ...

    def note_handoff(self, handoff_ns: int) -> None: ...

    def step(self) -> list[RequestOutput]: ...


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    """The context limit a config asks for, checked against the model's."""
    limit = model_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ConfigError("max_model_len", f"{config.max_model_len} exceeds the model's "
                          f"max_position_embeddings={limit}", f"use at most {limit}")
    max_len = config.max_model_len or limit
    model_config.check_window(max_len, f"pass --max-model-len {model_config.sliding_window} or less")
    return max_len


class Engine:
    """Scheduler + block manager + a runner; `itlbench.serving.build.create_engine` builds one from a config."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig | None, runner: Runner) -> None:
        self.model_config = model_config or load_model_config(config.model)
        self.max_model_len = resolve_max_model_len(config, self.model_config)
        self.tokenizer = load_tokenizer(self.model_config)
        self.runner = runner
        info = runner.info
        # the backend and block size that actually run (auto resolved; flash may need larger blocks)
        self.config = config = config.with_(attention=info.attention, block_size=info.block_size)
        self.block_manager = BlockManager(runner.num_blocks, config.block_size, config.prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len)
        self.step_log = StepLog()
        self._eos = self.model_config.eos_token_ids
        self.device, self.dtype = info.device, info.dtype
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._step = 0
        self._handoff_ns = 0

    @property
    def clock(self) -> StepClock:
        return self.runner.clock

    @property
    def runner_info(self) -> RunnerInfo:
        return self.runner.info

    # ----------------------------------------------------------------- requests

    def add_request(self, prompt: str | Sequence[int], sampling: SamplingParams, request_id: str | None = None,
                    arrival_ns: int | None = None) -> Request:
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self._validate(token_ids, sampling)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        elif request_id in self._requests:
            raise ConfigError("request_id", f"{request_id!r} is already in flight", "use a unique id")
        req = Request(request_id, token_ids, sampling,
                      arrival_ns=self.clock.now_ns() if arrival_ns is None else arrival_ns)
        self._requests[request_id] = req
        self.scheduler.add(req)
        return req

    def _validate(self, token_ids: list[int], sampling: SamplingParams) -> None:
        n, vocab = len(token_ids), self.model_config.vocab_size
        if n == 0:
            raise ConfigError("prompt", "is empty", "send at least one token")
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ConfigError("prompt", f"token id {bad} is outside the vocabulary [0, {vocab})",
                              f"send token ids below {vocab}")
        if n >= self.max_model_len:
            raise ConfigError("prompt", f"{n} tokens leave no room to generate within max_model_len="
                              f"{self.max_model_len}", "shorten the prompt or raise --max-model-len")
        if n + sampling.max_tokens > self.max_model_len:
            raise ConfigError("max_tokens", f"prompt {n} + max_tokens {sampling.max_tokens} exceeds "
                              f"max_model_len={self.max_model_len}", "lower max_tokens or shorten the prompt")
        bm = self.block_manager
        if bm.blocks_for(n + sampling.max_tokens) > bm.num_blocks:
            field = "prompt" if bm.blocks_for(n) > bm.num_blocks else "max_tokens"
            raise ConfigError(field, f"needs {bm.blocks_for(n + sampling.max_tokens)} KV blocks but the cache "
                              f"has {bm.num_blocks}", "raise kv_blocks / kv_memory_gib or send less")

    def abort(self, request_id: str) -> bool:
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        req.finished_ns = self.clock.now_ns()
        self._requests.pop(request_id, None)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ----------------------------------------------------------------- stepping

    def note_handoff(self, handoff_ns: int) -> None:
        """What a serving driver spent since the previous step delivering its outputs and taking in
        requests; recorded on the next step (StepRecord.handoff_ns)."""
        self._handoff_ns = handoff_ns

    def step(self) -> list[RequestOutput]:
        """schedule → run → commit, each timed (StepRecord.schedule_ns … output_ns) and NVTX-ranged."""
        clock = self.clock
        start_ns, wall_ns = clock.now_ns(), time.time_ns()
        with nvtx_range("schedule"):
            output = self.scheduler.schedule()
        scheduled_ns = clock.now_ns()
        if output.is_empty:
            finished = self.scheduler.commit(output, {}, self._eos)
            return self._outputs(output, {}, finished, clock.now_ns())
        for c in output.chunks:
            if c.request.first_scheduled_ns is None:
                c.request.first_scheduled_ns = start_ns
        run = self.runner.run(output, f"step/{output.phase}")
        sampled = run.tokens
        run_ns = clock.now_ns()
        with nvtx_range("output"):
            finished = self.scheduler.commit(output, sampled, self._eos)
        committed_ns = clock.now_ns()
        end_ns = clock.end_step(start_ns)
        outputs = self._outputs(output, sampled, finished, end_ns)
        forward = run.forward_ns or run_ns - scheduled_ns - run.prepare_ns - run.sample_ns
        parts = (scheduled_ns - start_ns, run.prepare_ns, forward, run.sample_ns, committed_ns - run_ns)
        self._record(output, len(finished), len(sampled), start_ns, end_ns, wall_ns, parts, run.cuda_graph)
        self._handoff_ns = 0
        return outputs

    def _outputs(self, output: SchedulerOutput, sampled: dict[str, int], finished: list[Request],
                 now_ns: int) -> list[RequestOutput]:
        done = {r.request_id for r in finished}
        results: list[RequestOutput] = []
        for c in output.chunks:
            req = c.request
            if req.request_id not in sampled or req.request_id in done:
                continue
            results.append(self._output(req, (sampled[req.request_id],), now_ns))
        for req in finished:
            token = sampled.get(req.request_id)
            results.append(self._output(req, () if token is None else (token,), now_ns))
            req.finished_ns = now_ns
            self._requests.pop(req.request_id, None)
        return results

    def _output(self, req: Request, new: tuple[int, ...], now_ns: int) -> RequestOutput:
        if new and req.first_token_ns is None:
            req.first_token_ns = now_ns
        return RequestOutput(req.request_id, new, req.is_finished, req.finish_reason, req.num_prompt_tokens,
                             req.num_output_tokens, req.num_cached_tokens, now_ns)

    def _record(self, output: SchedulerOutput, num_finished: int, num_sampled: int, start_ns: int, end_ns: int,
                wall_ns: int, parts: tuple[int, int, int, int, int], cuda_graph: bool) -> None:
        prefill_ids = tuple(c.request.request_id for c in output.chunks if not c.is_decode)
        pairs = sum(c.num_new_tokens * c.start + c.num_new_tokens * (c.num_new_tokens + 1) // 2 for c in output.chunks)
        self.step_log.append(StepRecord(
            step=self._step, phase=output.phase, prefill_tokens=output.num_prefill_tokens,
            decode_tokens=output.num_decode_tokens, num_prefill_reqs=len(prefill_ids),
            num_decode_reqs=len(output.chunks) - len(prefill_ids), num_running=self.num_running,
            num_waiting=self.num_waiting, num_preemptions=len(output.preempted),
            kv_usage=self.block_manager.usage, token_budget=output.token_budget, start_ns=start_ns,
            end_ns=end_ns, prefill_request_ids=prefill_ids, num_finished=num_finished, wall_start_ns=wall_ns,
            num_sampled=num_sampled, context_tokens=sum(c.start for c in output.chunks),
            attention_pairs=pairs, decode_context_tokens=sum(c.start for c in output.chunks if c.is_decode),
            schedule_ns=parts[0], prepare_ns=parts[1], forward_ns=parts[2], sample_ns=parts[3],
            output_ns=parts[4], handoff_ns=self._handoff_ns,
            cuda_graph=cuda_graph))
        self._step += 1

    # ----------------------------------------------------------------- convenience

    def generate(self, prompts: Sequence[str | Sequence[int]],
                 sampling: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
        """Run every prompt to completion; output token ids in prompt order."""
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        while self.has_unfinished():
            self.step()
        return [list(r.output_token_ids) for r in reqs]
