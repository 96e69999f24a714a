"""Prometheus metrics for the bundled engine, named like vLLM's under `itlbench_`.

One dashboard then serves vLLM (`vllm:`), SGLang and itlbench through a prefix variable. Updates
happen on the engine thread from step records and request outputs; the per-token path is a dict
lookup and one histogram observation. A private `CollectorRegistry` keeps several servers in one
process (tests, sweeps) from colliding.

A request with stop strings is ended by the front end (server/stop_strings.py), which sees its tokens a
step or more after the engine made them: by then the engine may have finished it itself ("length", EOS).
Its finish is therefore held until the front end's verdict (`await_verdict`, `verdict`) and recorded
with the response's reason and token count, as vLLM's front end records it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from itlbench.core.metric_buckets import ITL_BUCKETS, REQUEST_BUCKETS
from itlbench.core.request import Request, RequestOutput
from itlbench.core.steps import StepRecord

PREFIX = "itlbench_"
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5)) + (1e6,)
STEP_TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(18))
# Token-budget use per step: log-spaced from 0.1 % (a decode step of a few streams under a 2k-8k budget
# uses 0.1-1 %), then every 10 % up to a full budget (a long prompt's chunks fill it).
RATIO_BUCKETS: tuple[float, ...] = (0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                                    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
PHASES = ("prefill", "decode", "mixed", "idle")
FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class _Held:
    """A request whose finish waits for the front end's verdict: whichever of the two comes second records."""

    finish: tuple[RequestOutput, Request | None] | None = None
    verdict: tuple[str, int] | None = None


class ServerMetrics:
    """All server-side series, labelled with `model_name`; implements the engine observer hooks."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self._last_token_ns: dict[str, int] = {}
        self._held: dict[str, _Held] = {}  # engine thread and event loop: under _lock
        self._lock = threading.Lock()
        self._build_request_metrics()
        self._build_engine_metrics()

    # ---- construction ----------------------------------------------------------------------
    def _hist(self, name: str, doc: str, buckets: Sequence[float], extra: Sequence[str] = ()) -> Histogram:
        return Histogram(PREFIX + name, doc, ["model_name", *extra], buckets=buckets, registry=self.registry)

    def _counter(self, name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
        return Counter(PREFIX + name, doc, ["model_name", *extra], registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(PREFIX + name, doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _build_request_metrics(self) -> None:
        m = self.model_name
        self.ttft = self._hist("time_to_first_token_seconds", "Arrival to first token.", REQUEST_BUCKETS).labels(m)
        self.itl = self._hist("inter_token_latency_seconds", "Gap between a request's token outputs.",
                              ITL_BUCKETS).labels(m)
        self.e2e = self._hist("e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS).labels(m)
        self.queue_time = self._hist("request_queue_time_seconds", "Arrival to first scheduled step.",
                                     REQUEST_BUCKETS).labels(m)
        self.prefill_time = self._hist("request_prefill_time_seconds", "First scheduled step to first token.",
                                       REQUEST_BUCKETS).labels(m)
        self.decode_time = self._hist("request_decode_time_seconds", "First token to finish.",
                                      REQUEST_BUCKETS).labels(m)
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens of requests that produced a token.").labels(m)
        self.generation_tokens = self._counter("generation_tokens", "Generated tokens.").labels(m)
        self.request_success = self._counter("request_success", "Finished requests by reason.", ["finished_reason"])
        for reason in FINISH_REASONS:
            self.request_success.labels(m, reason)
        self.request_prompt_tokens = self._hist("request_prompt_tokens", "Prompt length of finished requests.",
                                                TOKEN_BUCKETS).labels(m)
        self.request_generation_tokens = self._hist("request_generation_tokens",
                                                    "Output length of finished requests.", TOKEN_BUCKETS).labels(m)

    def _build_engine_metrics(self) -> None:
        m = self.model_name
        self.running = self._gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = self._gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = self._gauge("kv_cache_usage_perc", "Fraction of KV blocks allocated (0..1).")
        self.preemptions = self._counter("num_preemptions", "Requests preempted to free KV blocks.").labels(m)
        self.iteration_tokens = self._hist("iteration_tokens_total", "Tokens scheduled per engine step.",
                                           STEP_TOKEN_BUCKETS).labels(m)
        self.step_duration = self._hist("engine_step_duration_seconds", "Engine step wall time by phase.",
                                        ITL_BUCKETS, ["phase"])
        self.steps = self._counter("engine_steps", "Engine steps by phase.", ["phase"])
        self._phase_children = {p: (self.step_duration.labels(m, p), self.steps.labels(m, p)) for p in PHASES}
        self.step_prefill = self._hist("engine_step_prefill_tokens", "Prefill tokens per step.",
                                       STEP_TOKEN_BUCKETS).labels(m)
        self.step_decode = self._hist("engine_step_decode_tokens", "Decode tokens per step.",
                                      STEP_TOKEN_BUCKETS).labels(m)
        self.budget_used = self._hist("engine_step_budget_used_ratio",
                                      "Scheduled tokens over the chunk budget (chunked steps only).",
                                      RATIO_BUCKETS).labels(m)
        self.config_info = Info(PREFIX + "engine_config", "Engine configuration.", ["model_name"],
                                registry=self.registry)

    def set_config(self, engine: Any) -> None:
        cfg = engine.config
        budget = "none" if cfg.chunk_budget is None else str(cfg.chunk_budget)
        self.config_info.labels(self.model_name).info({
            "chunk_budget": budget, "policy": cfg.policy, "mixed": str(cfg.mixed).lower(),
            "max_num_seqs": str(cfg.max_num_seqs), "block_size": str(cfg.block_size),
            "kv_blocks": str(engine.block_manager.num_blocks), "device": str(engine.device),
            "dtype": str(engine.dtype), "model": engine.model_config.name})
        self.update_gauges(engine)

    # ---- engine observer hooks (engine thread) ---------------------------------------------
    def update_gauges(self, engine: Any) -> None:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv_usage.set(engine.block_manager.usage)

    def on_step(self, records: Sequence[StepRecord], engine: Any) -> None:
        for rec in records:
            self._observe_step(rec)
        self.update_gauges(engine)

    def _observe_step(self, rec: StepRecord) -> None:
        duration, count = self._phase_children.get(rec.phase) or (
            self.step_duration.labels(self.model_name, rec.phase), self.steps.labels(self.model_name, rec.phase))
        duration.observe(rec.duration_s)
        count.inc()
        tokens = rec.scheduled_tokens
        self.iteration_tokens.observe(tokens)
        self.step_prefill.observe(rec.prefill_tokens)
        self.step_decode.observe(rec.decode_tokens)
        if rec.token_budget:
            self.budget_used.observe(tokens / rec.token_budget)
        if rec.num_preemptions:
            self.preemptions.inc(rec.num_preemptions)

    def on_outputs(self, outputs: Sequence[RequestOutput], requests: dict[str, Request]) -> None:
        last = self._last_token_ns
        for out in outputs:
            n = len(out.new_token_ids)
            if n:
                self.generation_tokens.inc(n)
                prev = last.get(out.request_id)
                if prev is None:
                    self._first_token(out, requests.get(out.request_id))
                else:
                    self.itl.observe((out.time_ns - prev) / 1e9)
                last[out.request_id] = out.time_ns
            if out.finished:
                self._finished(out, requests.get(out.request_id))
                last.pop(out.request_id, None)

    def _first_token(self, out: RequestOutput, req: Request | None) -> None:
        self.prompt_tokens.inc(out.num_prompt_tokens)
        if req is not None and req.arrival_ns:
            self.ttft.observe((out.time_ns - req.arrival_ns) / 1e9)

    # ---- stop strings (event loop) -------------------------------------------------------------
    def await_verdict(self, request_id: str) -> None:
        """Hold `request_id`'s finish until `verdict` (call before the request is added)."""
        with self._lock:
            self._held[request_id] = _Held()

    def verdict(self, request_id: str, reason: str | None, num_output_tokens: int | None = None) -> None:
        """How the response ended: `reason` "stop" (a stop string, after `num_output_tokens`) overrides the
        engine's finish; None lets the engine's stand (also for a request never admitted)."""
        with self._lock:
            held = self._held.get(request_id)
            if held is None:
                return
            if held.finish is None:
                if reason is None:
                    del self._held[request_id]  # the engine's finish, when it comes, is recorded as it is
                else:
                    held.verdict = (reason, num_output_tokens or 0)
                return
            del self._held[request_id]
        out, req = held.finish
        if reason is not None:
            out = _overridden(out, (reason, num_output_tokens or 0))
        self._record_finish(out, req)

    def _finished(self, out: RequestOutput, req: Request | None) -> None:
        if self._held:
            with self._lock:
                held = self._held.get(out.request_id)
                if held is not None:
                    if held.verdict is None:
                        held.finish = (out, req)
                        return
                    del self._held[out.request_id]
                    out = _overridden(out, held.verdict)
        self._record_finish(out, req)

    def _record_finish(self, out: RequestOutput, req: Request | None) -> None:
        self.request_success.labels(self.model_name, out.finish_reason or "stop").inc()
        self.request_prompt_tokens.observe(out.num_prompt_tokens)
        self.request_generation_tokens.observe(out.num_output_tokens)
        if req is None or not req.arrival_ns:
            return
        end = req.finished_ns or out.time_ns
        self.e2e.observe((end - req.arrival_ns) / 1e9)
        if req.first_scheduled_ns:
            self.queue_time.observe((req.first_scheduled_ns - req.arrival_ns) / 1e9)
            if req.first_token_ns:
                self.prefill_time.observe((req.first_token_ns - req.first_scheduled_ns) / 1e9)
        if req.first_token_ns:
            self.decode_time.observe((end - req.first_token_ns) / 1e9)

    @property
    def num_held(self) -> int:
        """Finishes waiting for a verdict (tests: none is left behind)."""
        return len(self._held)

    # ---- exposition --------------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _overridden(out: RequestOutput, verdict: tuple[str, int]) -> RequestOutput:
    reason, kept = verdict
    return dataclasses.replace(out, finish_reason=reason, num_output_tokens=min(out.num_output_tokens, kept))
