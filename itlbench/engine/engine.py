"""`Engine`: the synchronous core. Each `step()` is schedule → flatten → run → sample → commit."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from itlbench.engine.batch import flatten
from itlbench.engine.block_manager import BlockManager
from itlbench.engine.config import EngineConfig, ModelConfig, load_model_config
from itlbench.engine.instrument import StepLog, StepRecord, step_tokens_note
from itlbench.engine.request import Request, RequestOutput, SamplingParams
from itlbench.engine.runner import ModelRunner
from itlbench.engine.sampler import Sampler
from itlbench.engine.scheduler import Scheduler
from itlbench.engine.scheduler_output import SchedulerOutput
from itlbench.engine.tokenizer import load_tokenizer
from itlbench.errors import ConfigError


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
        self.runner = ModelRunner(config, self.model_config, self.max_model_len, attention_backend)
        # the backend and block size that actually run (auto resolved; flash may need larger blocks)
        self.config = config = config.with_(attention=getattr(self.runner, "attention", config.attention),
                                            block_size=getattr(self.runner, "block_size", config.block_size))
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len)
        self.sampler = Sampler(config.seed)
        self.step_log = StepLog()
        self._eos = self.model_config.eos_token_ids
        self.device = str(self.runner.device)
        self.dtype = str(self.runner.dtype).removeprefix("torch.")
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self._step = 0

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
                      arrival_ns=time.perf_counter_ns() if arrival_ns is None else arrival_ns)
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
        req.finished_ns = time.perf_counter_ns()
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

    def step(self) -> list[RequestOutput]:
        start_ns, wall_ns = time.perf_counter_ns(), time.time_ns()
        output = self.scheduler.schedule()
        if output.is_empty:
            finished = self.scheduler.commit(output, {}, self._eos)
            return self._outputs(output, {}, finished, time.perf_counter_ns())
        for c in output.chunks:
            if c.request.first_scheduled_ns is None:
                c.request.first_scheduled_ns = start_ns
        batch = flatten(output, self.config.block_size, self.runner.device)
        logits = self.runner.execute(batch, f"step/{output.phase}",
                                     step_tokens_note(output.num_prefill_tokens, output.num_decode_tokens))
        tokens = self.sampler(logits, batch.sample_requests) if batch.sample_requests else []
        sampled = {r.request_id: t for r, t in zip(batch.sample_requests, tokens, strict=True)}
        finished = self.scheduler.commit(output, sampled, self._eos)
        end_ns = time.perf_counter_ns()
        outputs = self._outputs(output, sampled, finished, end_ns)
        self._record(output, len(finished), start_ns, end_ns, wall_ns)
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

    def _record(self, output: SchedulerOutput, num_finished: int, start_ns: int, end_ns: int,
                wall_ns: int) -> None:
        prefill_ids = tuple(c.request.request_id for c in output.chunks if not c.is_decode)
        self.step_log.append(StepRecord(
            step=self._step, phase=output.phase, prefill_tokens=output.num_prefill_tokens,
            decode_tokens=output.num_decode_tokens, num_prefill_reqs=len(prefill_ids),
            num_decode_reqs=len(output.chunks) - len(prefill_ids), num_running=self.num_running,
            num_waiting=self.num_waiting, num_preemptions=len(output.preempted),
            kv_usage=self.block_manager.usage, token_budget=output.token_budget, start_ns=start_ns,
            end_ns=end_ns, prefill_request_ids=prefill_ids, num_finished=num_finished, wall_start_ns=wall_ns,
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

