"""`Engine`: the synchronous core. Each `step()` is schedule → run → commit.

"Run" is pluggable: the torch runner flattens the chunks, runs the model and samples; the simulated
runner (engine/sim.py) charges the step's roofline cost to a virtual clock and makes up tokens. Both
sit under the same scheduler and block manager, and the engine stamps every time through the
runner's clock, so a simulated step log is a step log. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any, Protocol

from itlbench.engine.block_manager import BlockManager
from itlbench.engine.config import EngineConfig, ModelConfig, load_model_config
from itlbench.engine.instrument import StepLog, StepRecord, nvtx_range, step_tokens_note
from itlbench.engine.request import Request, RequestOutput, SamplingParams
from itlbench.engine.scheduler import Scheduler
from itlbench.engine.scheduler_output import SchedulerOutput
from itlbench.engine.tokenizer import load_tokenizer
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


def _max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    limit = model_config.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ConfigError("max_model_len", f"{config.max_model_len} exceeds the model's "
                          f"max_position_embeddings={limit}", f"use at most {limit}")
    return config.max_model_len


class Engine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None,
                 attention_backend: str | None = None) -> None:
        self.config = config
        self.model_config = model_config or load_model_config(config.model)
        self.max_model_len = _max_model_len(config, self.model_config)
        self.tokenizer = load_tokenizer(self.model_config)
        self.runner: Any
        self.sampler: Any = None
        self.clock: StepClock
        if config.runner == "sim":
            from itlbench.engine.sim import SimRunner

            self.runner = SimRunner(config, self.model_config, self.max_model_len)
            self.clock = self.runner.clock
            self._execute = self.runner.run
        else:
            from itlbench.engine.batch import Flattener
            from itlbench.engine.runner import ModelRunner
            from itlbench.engine.sampler import Sampler

            self.runner = ModelRunner(config, self.model_config, self.max_model_len, attention_backend)
            # the backend and block size that actually run (auto resolved; flash may need larger blocks)
            self.config = config = config.with_(attention=getattr(self.runner, "attention", config.attention),
                                                block_size=getattr(self.runner, "block_size", config.block_size))
            self.sampler = Sampler(config.seed)
            self._flatten = Flattener(config.block_size, self.runner.device)
            self.clock = WallClock()
            self._execute = self._execute_torch
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len)
        self.step_log = StepLog()
        self._eos = self.model_config.eos_token_ids
        self.device = str(self.runner.device)
        self.dtype = str(self.runner.dtype).removeprefix("torch.")
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._step = 0
        self._handoff_ns = 0
        self._split = (0, 0, 0)  # prepare, forward, sample of the step being run (torch runner)

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
            raise ConfigError("prompt", f"token id {bad} is outside the vocabulary [0, {vocab})")
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
        self._split = (0, 0, 0)
        sampled = self._execute(output, f"step/{output.phase}")
        run_ns = clock.now_ns()
        with nvtx_range("output"):
            finished = self.scheduler.commit(output, sampled, self._eos)
        committed_ns = clock.now_ns()
        end_ns = clock.end_step(start_ns)
        outputs = self._outputs(output, sampled, finished, end_ns)
        prepare, forward, sample = self._split
        if not forward:  # a runner that does not split its work (the simulator): all of it is forward
            forward = run_ns - scheduled_ns - prepare - sample
        parts = (scheduled_ns - start_ns, prepare, forward, sample, committed_ns - run_ns)
        self._record(output, len(finished), len(sampled), start_ns, end_ns, wall_ns, parts)
        self._handoff_ns = 0
        return outputs

    def _execute_torch(self, output: SchedulerOutput, label: str) -> dict[str, int]:
        """Flatten the chunks into one row batch, run the model, sample the rows that yield a token;
        the three parts' durations go to `self._split`."""
        t0 = time.perf_counter_ns()
        with nvtx_range("prepare"):
            batch = self._flatten(output)
        t1 = time.perf_counter_ns()
        # the forward's own NVTX range is the runner's `step/<phase>`
        logits = self.runner.execute(batch, label,
                                     step_tokens_note(output.num_prefill_tokens, output.num_decode_tokens))
        t2 = time.perf_counter_ns()
        with nvtx_range("sample"):
            tokens = (self.sampler(logits, batch.sample_requests, self.runner.last_greedy)
                      if batch.sample_requests else [])
        t3 = time.perf_counter_ns()
        self._split = (t1 - t0, t2 - t1, t3 - t2)
        return {r.request_id: t for r, t in zip(batch.sample_requests, tokens, strict=True)}

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
                wall_ns: int, parts: tuple[int, int, int, int, int]) -> None:
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
            cuda_graph=getattr(self.runner, "last_cuda_graph", False)))
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



def create_engine(config: EngineConfig, model_config: ModelConfig | None = None) -> Any:
    """The engine a config asks for: `Engine` (torch or simulated runner), or simulated prefill and
    decode pools (`DisaggEngine`, same surface) when `sim_disaggregate` is set."""
    if config.runner == "sim" and config.sim_disaggregate:
        from itlbench.engine.disagg import DisaggEngine, KvLink

        return DisaggEngine(config, model_config, link=KvLink(config.sim_kv_link_gbps * 1e9 / 8),
                            prefill_gpu=config.sim_prefill_gpu)
    return Engine(config, model_config)
