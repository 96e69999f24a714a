"""Token-budget scheduling with two policies, the two designs this tool exists to compare.

"budget" (vLLM V1): every step closes each request's gap between known and computed tokens under one
token budget; running requests go first, so decodes always ride along and prefill and decode mix
without either being named. "prefill-first" (SGLang): any pending prefill owns the step and decodes
wait for it, unless `mixed` lets them ride in the prefill step. Torch-free.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Collection, Mapping

from itlbench.core.block_manager import BlockManager
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import Request, RequestStatus
from itlbench.core.scheduler_output import ScheduledChunk, SchedulerOutput

_UNLIMITED = sys.maxsize


class _Step:
    """Mutable state of one schedule() call: tokens left, what is already placed, what was preempted."""

    def __init__(self, budget: int | None) -> None:
        self.budget_left = _UNLIMITED if budget is None else budget
        self.output = SchedulerOutput(token_budget=budget)
        self.scheduled: set[str] = set()

    def add(self, request: Request, num_new_tokens: int) -> None:
        start = request.num_computed_tokens
        self.output.chunks.append(ScheduledChunk(request, start, num_new_tokens, request.is_decoding))
        self.scheduled.add(request.request_id)
        self.budget_left -= num_new_tokens

    @property
    def has_prefill(self) -> bool:
        return any(not c.is_decode for c in self.output.chunks)


class Scheduler:
    """Decides each step's chunks and applies the sampled tokens; owns the waiting and running queues."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int) -> None:
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Requests the scheduler itself gave up on (they can never fit); reported by the next commit().
        self._dropped: list[Request] = []

    # ----------------------------------------------------------------- queue management

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Remove a request wherever it is and release its blocks; None if it is not here."""
        request = self._take(request_id)
        if request is not None:
            self.block_manager.free(request)
            request.status = RequestStatus.FINISHED_ABORTED
        return request

    def _take(self, request_id: str) -> Request | None:
        for i, req in enumerate(self.running):
            if req.request_id == request_id:
                return self.running.pop(i)
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                return req
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ----------------------------------------------------------------- scheduling

    def schedule(self) -> SchedulerOutput:
        step = _Step(self.config.chunk_budget)
        if self.config.policy == "prefill-first":
            self._schedule_prefill_first(step)
        else:
            self._schedule_budget(step)
        return step.output

    def _schedule_budget(self, step: _Step) -> None:
        """vLLM V1: running requests first (decodes cost one token), then admit waiting FIFO."""
        for req in list(self.running):
            if step.budget_left <= 0:
                break
            self._schedule_running(step, req)
        self._admit_waiting(step)

    def _schedule_prefill_first(self, step: _Step) -> None:
        """SGLang: a pending prefill owns the step; decodes run alone only when none is pending."""
        if self.config.mixed and self._prefill_pending():
            self._schedule_decodes(step)  # reserved first, so a long prompt can never crowd them out
        for req in list(self.running):
            if step.budget_left <= 0:
                break
            if req.status is RequestStatus.RUNNING and not req.is_decoding:
                self._schedule_running(step, req)
        self._admit_waiting(step)
        if not step.has_prefill:
            self._schedule_decodes(step)

    def _prefill_pending(self) -> bool:
        return bool(self.waiting) or any(not r.is_decoding for r in self.running)

    def _schedule_decodes(self, step: _Step) -> None:
        for req in list(self.running):
            if step.budget_left <= 0:
                break
            if req.status is RequestStatus.RUNNING and req.is_decoding and req.request_id not in step.scheduled:
                self._schedule_running(step, req)

    def _schedule_running(self, step: _Step, req: Request) -> None:
        """Give a running request min(uncomputed, budget left) tokens, preempting others for blocks."""
        if req.status is not RequestStatus.RUNNING:
            return  # preempted earlier in this step
        num_new = min(req.num_uncomputed_tokens, step.budget_left)
        if num_new > 0 and self._allocate_or_preempt(step, req, req.num_computed_tokens + num_new):
            step.add(req, num_new)

    def _allocate_or_preempt(self, step: _Step, req: Request, num_slots: int) -> bool:
        """Recompute-preempt the newest unscheduled running request until `req` fits, or `req` itself goes."""
        if self.block_manager.blocks_for(num_slots) > self.block_manager.num_blocks:
            self._drop(req)
            return False
        while not self.block_manager.allocate(req, num_slots):
            victim = next(r for r in reversed(self.running) if r.request_id not in step.scheduled)
            self._preempt(step, victim)
            if victim is req:
                return False
        return True

    def _preempt(self, step: _Step, req: Request) -> None:
        self.running.remove(req)
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        step.output.preempted.append(req)

    def _drop(self, req: Request) -> None:
        """Abort a request that needs more KV blocks than exist, instead of preempting forever."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.block_manager.free(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._dropped.append(req)

    def _admit_waiting(self, step: _Step) -> None:
        """Admit FIFO while budget, sequence slots and free blocks last; never preempt to admit."""
        if step.output.preempted:
            return  # blocks are short this step; the preempted requests come back first next step
        while self.waiting and step.budget_left > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if self.block_manager.blocks_for(req.num_tokens) > self.block_manager.num_blocks:
                self._drop(req)
                continue
            if not self._admit(step, req):
                break

    def _admit(self, step: _Step, req: Request) -> bool:
        hits = self.block_manager.match_prefix(req.token_slice(0, req.num_tokens), req.num_tokens - 1)
        num_cached = len(hits) * self.block_manager.block_size
        num_new = min(req.num_tokens - num_cached, step.budget_left)
        if self._over_unchunked_cap(step, num_new):
            return False
        if not self.block_manager.allocate(req, num_cached + num_new, hits):
            return False
        self.waiting.popleft()
        req.num_computed_tokens = num_cached
        req.num_cached_tokens = num_cached
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        step.add(req, num_new)
        return True

    def _over_unchunked_cap(self, step: _Step, num_new: int) -> bool:
        """Unchunked prompts are never split, but one step takes more of them only while its prefill
        stays within `unchunked_prefill_cap` (the first prompt always goes, whatever its length), as
        SGLang's max_prefill_tokens bounds a step with chunking off."""
        if self.config.chunk_budget is not None:
            return False
        prefill = step.output.num_prefill_tokens
        return prefill > 0 and prefill + num_new > self.config.unchunked_prefill_cap

    # ----------------------------------------------------------------- applying results

    def commit(self, output: SchedulerOutput, sampled: Mapping[str, int],
               eos_token_ids: Collection[int]) -> list[Request]:
        """Advance computed tokens, append sampled ones, and retire finished requests."""
        finished, self._dropped = self._dropped, []
        for chunk in output.chunks:
            req = chunk.request
            if req.status is not RequestStatus.RUNNING or req.num_computed_tokens != chunk.start:
                continue  # aborted (or otherwise reset) since schedule()
            samples = chunk.samples
            req.num_computed_tokens = chunk.end
            self.block_manager.cache_full_blocks(req, req.num_computed_tokens)
            if not samples:
                continue
            token = sampled[req.request_id]
            req.output_token_ids.append(token)
            status = self._stop_status(req, token, eos_token_ids)
            if status is not None:
                self._finish(req, status)
                finished.append(req)
        return finished

    def _stop_status(self, req: Request, token: int, eos_token_ids: Collection[int]) -> RequestStatus | None:
        sp = req.sampling
        if req.num_output_tokens >= sp.min_tokens:
            if (token in eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= sp.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        self.running.remove(req)
        self.block_manager.free(req)
        req.status = status
