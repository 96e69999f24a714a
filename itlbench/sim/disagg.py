"""What-if: prefill and decode on separate GPU pools (DistServe-style disaggregation), simulated.

Two simulated engines, each with the real scheduler and block manager: a request is prefilled on the
prefill pool (which produces its first token), its K/V crosses a link (`KvLink`: bytes / bandwidth +
latency), lands in the decode pool's cache as prefix-cached blocks, and the decode pool carries on
from there. Decode steps never wait for a prefill; the price is the transfer and two sets of GPUs.

`DisaggEngine` offers the surface `AsyncEngine` and the server use (`add_request`, `step`, `abort`,
`step_log`, ...), so a disaggregated sim is served and measured like any engine. Both pools run on
virtual clocks; `step()` starts every idle pool that has work at the current time, then returns the
outputs of the next step to finish (sleeping until then when paced, so streams keep simulated time).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from itlbench.core.engine import Engine, RunnerInfo
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import load_model_config
from itlbench.core.request import Request, RequestOutput, RequestStatus, SamplingParams
from itlbench.core.steps import StepLog, StepRecord
from itlbench.errors import ConfigError
from itlbench.sim.runner import DEFAULT_GPU, VirtualClock, offline_engine

_MAX_SLEEP_NS = 2_000_000  # paced: wake at least this often so new arrivals start an idle pool promptly


@dataclass(frozen=True)
class KvLink:
    """The prefill → decode K/V path: 400 Gb/s (InfiniBand NDR, one port per GPU) by default."""

    bandwidth_bytes_per_s: float = 50e9
    latency_s: float = 20e-6

    def transfer_s(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass
class _Handoff:
    ready_ns: int
    request_id: str
    token_ids: list[int]  # prompt + first token
    sampling: SamplingParams  # what is left to generate


@dataclass
class _Held:
    """A pool step already simulated, whose results become visible at its end."""

    end_ns: int
    pool: str
    records: list[StepRecord]
    outputs: list[RequestOutput]


class _WallNow:
    def now_ns(self) -> int:
        return time.perf_counter_ns()


class DisaggEngine:
    """Prefill pool + KV link + decode pool, each pool an `Engine` with a simulated runner."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None, *, paced: bool = True,
                 link: KvLink | None = None, prefill_gpu: str | None = None, start_ns: int = 0) -> None:
        if not config.prefix_caching:
            raise ConfigError("prefix_caching", "disaggregation hands K/V over as cached prefix blocks",
                              "leave prefix caching on")
        self.config = config
        self.model_config = model_config or load_model_config(config.model)
        self.paced = paced
        self.link = link or KvLink()
        self.time_scale = config.sim_time_scale if paced else 1.0
        decode_gpu = config.gpu or DEFAULT_GPU
        self.pools = {
            "prefill": self._pool(config.with_(engine="sim", gpu=prefill_gpu or decode_gpu)),
            "decode": self._pool(config.with_(engine="sim", gpu=decode_gpu)),
        }
        self.prefill, self.decode = self.pools["prefill"], self.pools["decode"]
        self.max_model_len = self.decode.max_model_len
        self.tokenizer = self.decode.tokenizer
        self.block_manager = self.decode.block_manager
        pools = (self.prefill.runner.info.device, self.decode.runner.info.device)  # "sim:h100", "sim:h100x2" (--tp)
        self.device = "sim:" + "->".join(d.removeprefix("sim:") for d in pools)
        self.dtype = self.decode.dtype
        self.step_log = StepLog()
        # under --tp each GPU sends its heads' share over its own port, in parallel: one GPU's share is the time
        self.kv_bytes_per_token = self.decode.runner.cost_model.kv_bytes_per_token_per_gpu
        self.clock = _WallNow() if paced else VirtualClock(start_ns)
        self._free_at = {name: 0 for name in self.pools}
        self._held: list[tuple[int, int, _Held]] = []  # heap by end time
        self._handoffs: list[_Handoff] = []
        self._original: dict[str, SamplingParams] = {}
        self._prompts: dict[str, list[int]] = {}
        self._requests: dict[str, Request] = {}  # the prefill-pool request the caller holds
        self._order = itertools.count()
        self._step = 0
        self._ids = itertools.count()

    def _pool(self, config: EngineConfig) -> Engine:
        return offline_engine(config, self.model_config, 0, self.time_scale)

    # ----------------------------------------------------------------- requests

    def add_request(self, prompt: str | Sequence[int], sampling: SamplingParams, request_id: str | None = None,
                    arrival_ns: int | None = None) -> Request:
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self.decode._validate(token_ids, sampling)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._original:
            raise ConfigError("request_id", f"{request_id!r} is already in flight", "use a unique id")
        first = replace(sampling, max_tokens=1, min_tokens=min(sampling.min_tokens, 1))
        arrival = self.clock.now_ns() if arrival_ns is None else arrival_ns
        req = self.prefill.add_request(token_ids, first, request_id, arrival)
        self._original[request_id] = sampling
        self._prompts[request_id] = token_ids
        self._requests[request_id] = req
        return req

    def abort(self, request_id: str) -> bool:
        found = self.prefill.abort(request_id) | self.decode.abort(request_id)
        before = len(self._handoffs)
        self._handoffs = [h for h in self._handoffs if h.request_id != request_id]
        found |= len(self._handoffs) != before
        self._forget(request_id)
        return found

    def _forget(self, request_id: str) -> None:
        self._original.pop(request_id, None)
        self._prompts.pop(request_id, None)
        self._requests.pop(request_id, None)

    def note_handoff(self, handoff_ns: int) -> None:
        """The serving driver's hand-off time: the pools run on a virtual clock, so nothing to record."""

    @property
    def runner_info(self) -> RunnerInfo:
        return replace(self.decode.runner_info, device=self.device)

    def has_unfinished(self) -> bool:
        return bool(self._held or self._handoffs or self.prefill.has_unfinished() or self.decode.has_unfinished())

    @property
    def num_running(self) -> int:
        return self.prefill.num_running + self.decode.num_running

    @property
    def num_waiting(self) -> int:
        return self.prefill.num_waiting + self.decode.num_waiting + len(self._handoffs)

    # ----------------------------------------------------------------- stepping

    def step(self) -> list[RequestOutput]:
        now = self.clock.now_ns()
        self._admit_handoffs(now)
        for name, pool in self.pools.items():
            if self._free_at[name] <= now and pool.has_unfinished():
                self._start(name, pool, max(now, self._free_at[name]))
        wake = self._next_event()
        if wake is None:
            return []
        if self.paced:
            target = min(wake, now + _MAX_SLEEP_NS)
            if target > now:
                time.sleep((target - now) / 1e9)
            if target < wake:
                return []  # nothing due yet: let the caller admit new arrivals
        else:
            self.clock.advance_to(wake)  # type: ignore[union-attr]
        return self._release(wake)

    def _start(self, name: str, pool: Engine, at_ns: int) -> None:
        pool.clock.advance_to(at_ns)  # type: ignore[attr-defined]
        last = pool.step_log.last_step
        outputs = pool.step()
        records = pool.step_log.since(last + 1)
        if not records:  # nothing schedulable (blocks short): retry once something else happens
            self._free_at[name] = self._next_event() or at_ns + _MAX_SLEEP_NS
            if outputs:  # requests the scheduler dropped
                heapq.heappush(self._held, (at_ns, next(self._order), _Held(at_ns, name, [], outputs)))
            return
        end = records[-1].end_ns
        self._free_at[name] = end
        heapq.heappush(self._held, (end, next(self._order), _Held(end, name, records, outputs)))

    def _next_event(self) -> int | None:
        times = [h[0] for h in self._held[:1]] + [h.ready_ns for h in self._handoffs]
        return min(times) if times else None

    def _release(self, until_ns: int) -> list[RequestOutput]:
        released: list[RequestOutput] = []
        while self._held and self._held[0][0] <= until_ns:
            _, _, held = heapq.heappop(self._held)
            for rec in held.records:
                self.step_log.append(replace(rec, step=self._step))
                self._step += 1
            released += self._prefill_outputs(held) if held.pool == "prefill" else self._decode_outputs(held)
        return released

    def _prefill_outputs(self, held: _Held) -> list[RequestOutput]:
        """First tokens go to the client; unfinished requests leave for the decode pool."""
        out = []
        for o in held.outputs:
            sampling = self._original.get(o.request_id)
            if sampling is None or not o.finished:
                out.append(o)
                continue
            if o.finish_reason == "abort" or sampling.max_tokens == 1 or (o.finish_reason == "stop" and o.new_token_ids):
                self._forget(o.request_id)
                out.append(o)
                continue
            out.append(replace(o, finished=False, finish_reason=None))
            tokens = [*self._prompts[o.request_id], *o.new_token_ids]
            ready = held.end_ns + round(self.link.transfer_s(len(tokens) * self.kv_bytes_per_token)
                                        / self.time_scale * 1e9)
            rest = replace(sampling, max_tokens=sampling.max_tokens - 1, min_tokens=max(0, sampling.min_tokens - 1))
            self._handoffs.append(_Handoff(ready, o.request_id, tokens, rest))
            if o.request_id in self._requests:
                self._requests[o.request_id].finished_ns = None  # it finishes on the decode pool
        return out

    def _decode_outputs(self, held: _Held) -> list[RequestOutput]:
        """Decode-pool counts are of the handed-over request (prompt + first token): restore the client's."""
        out = []
        for o in held.outputs:
            prompt = self._prompts.get(o.request_id)
            if prompt is None:
                out.append(o)
                continue
            out.append(replace(o, num_prompt_tokens=len(prompt), num_output_tokens=o.num_output_tokens + 1))
            if o.finished:
                if o.request_id in self._requests:
                    self._requests[o.request_id].finished_ns = o.time_ns
                self._forget(o.request_id)
        return out

    def _admit_handoffs(self, now_ns: int) -> None:
        """Requests whose K/V has arrived: write it into the decode pool's cache as cached prefix blocks,
        then admit them; the decode pool computes only the last token's row."""
        due = [h for h in self._handoffs if h.ready_ns <= now_ns]
        if not due:
            return
        self._handoffs = [h for h in self._handoffs if h.ready_ns > now_ns]
        bm = self.decode.block_manager
        for h in due:
            carrier = Request(f"kv:{h.request_id}", h.token_ids, h.sampling)
            if bm.allocate(carrier, len(h.token_ids)):  # no room: the decode pool recomputes instead
                bm.cache_full_blocks(carrier, len(h.token_ids))
                bm.free(carrier)
            carrier.status = RequestStatus.FINISHED_ABORTED
            self.decode.add_request(h.token_ids, h.sampling, h.request_id, h.ready_ns)
