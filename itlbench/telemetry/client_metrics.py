"""Client-side Prometheus metrics of a live run (`itlbench run --metrics-port P`), `itlbench_client_*`.

Labels are bounded: workload (catalog names, "injected", "trace"), prompt_bucket (six buckets),
injected, outcome (four statuses), cause (six stall causes). What identifies the run (run id,
workload, chunk budget, engine) is on one `itlbench_client_run_info` gauge, never on every series.
Latency buckets are the server's (core/metric_buckets.py: ITL dense from 1 ms to 100 ms, each set
containing vLLM's for the same latency), so client and server histograms compare bucket for bucket.
Per chunk this costs two observations and a median update; nothing here runs when the flag is off.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.core.metric_buckets import ITL_BUCKETS, REQUEST_BUCKETS
from itlbench.telemetry.live_stalls import CAUSES
from itlbench.workloads.plan import RequestPlan

PREFIX = "itlbench_client_"
OUTCOMES = ("ok", "error", "timeout", "cancelled")
BOOLS = ("false", "true")
RUN_INFO_LABELS = ("run_id", "workload", "chunk_budget", "policy", "engine", "model")


class WindowMax:
    """The largest value seen in the last `window_s` seconds (per-second maxima, read at scrape time):
    the worst gap lives between scrapes, which a histogram would blur into its bucket."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_ns = int(window_s * 1e9)
        self._maxima: deque[list[int]] = deque()  # [second, max value in ns]

    def add(self, t_ns: int, value_ns: int) -> None:
        sec = t_ns // 1_000_000_000
        last = self._maxima[-1] if self._maxima else None
        if last is not None and last[0] == sec:
            if value_ns > last[1]:
                last[1] = value_ns
            return
        self._maxima.append([sec, value_ns])
        while len(self._maxima) > 1 and (sec - self._maxima[0][0]) * 1_000_000_000 > self.window_ns:
            self._maxima.popleft()

    def value_s(self, now_ns: int) -> float:
        cutoff = (now_ns - self.window_ns) // 1_000_000_000
        return max((m for s, m in list(self._maxima) if s >= cutoff), default=0) / 1e9


class ClientMetrics:
    """All `itlbench_client_*` series of one process, in a private registry."""

    def __init__(self, itl_window_s: float = 10.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "Scheduled send to first token-carrying chunk.",
                              ["workload", "prompt_bucket", "injected"], buckets=REQUEST_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Every gap between consecutive content "
                             "chunks of a stream.", ["workload", "injected"], buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Scheduled send to end of stream.",
                             ["workload", "prompt_bucket", "injected"], buckets=REQUEST_BUCKETS, registry=r)
        self.send_lag = Histogram(PREFIX + "send_lag_seconds", "Scheduled send to actual send (client lag).",
                                  buckets=ITL_BUCKETS, registry=r)
        self.requests = Counter(PREFIX + "requests", "Finished requests by outcome.", ["outcome", "injected"],
                                registry=r)
        self.sent = Counter(PREFIX + "requests_sent", "Requests sent.", ["injected"], registry=r)
        self.output_tokens = Counter(PREFIX + "output_tokens", "Tokens received in content chunks.", registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of requests sent.", registry=r)
        self.in_flight = Gauge(PREFIX + "requests_in_flight", "Requests sent and not yet ended.", ["injected"],
                               registry=r)
        self.loop_lag = Gauge(PREFIX + "loop_lag_seconds", "Event-loop lag at the latest client sample.",
                              registry=r)
        self.cpu = Gauge(PREFIX + "cpu_percent", "Client process CPU at the latest sample (100 = one core).",
                         registry=r)
        self.stalls = Counter(PREFIX + "stalls", "Stalled gaps (gap >= max(factor x its request's median gap, "
                              "floor)) by cause.", ["cause"], registry=r)
        self.stalled = Counter(PREFIX + "stalled_seconds", "Seconds of stalled gaps by cause.", ["cause"],
                               registry=r)
        self.run_info = Gauge(PREFIX + "run_info", "The run this client is driving (value 1).",
                              list(RUN_INFO_LABELS), registry=r)
        self.itl_max = WindowMax(itl_window_s)
        Gauge(PREFIX + "inter_token_latency_max_seconds", f"Largest gap in the last {itl_window_s:g} s.",
              registry=r).set_function(self._itl_max_now)
        self._children: dict[tuple[str, str, bool], tuple[Any, Any, Any]] = {}
        for flag in BOOLS:  # zero series from the start: rate() and increase() see the first event
            self.sent.labels(flag)
            self.in_flight.labels(flag)
            for outcome in OUTCOMES:
                self.requests.labels(outcome, flag)
        for cause in CAUSES:
            self.stalls.labels(cause)
            self.stalled.labels(cause)
        self._stall_children = {c: (self.stalls.labels(c), self.stalled.labels(c)) for c in CAUSES}

    def _itl_max_now(self) -> float:
        return self.itl_max.value_s(time.perf_counter_ns())

    def children(self, plan: RequestPlan, bucket: str) -> tuple[Any, Any, Any]:
        """(ttft, itl, e2e) histogram children of a request's labels, cached."""
        return self._child(plan.workload, bucket, plan.injected)

    def _child(self, workload: str, bucket: str, injected: bool) -> tuple[Any, Any, Any]:
        key = (workload, bucket, injected)
        got = self._children.get(key)
        if got is None:
            flag = BOOLS[injected]
            got = (self.ttft.labels(workload, bucket, flag), self.itl.labels(workload, flag),
                   self.e2e.labels(workload, bucket, flag))
            self._children[key] = got
        return got

    def zero_workloads(self, workloads: Iterable[tuple[str, bool]]) -> None:
        """Zero series for every prompt bucket of these (workload, injected) pairs before the load: a
        series born at its first request is first scraped at 1, and rate() never sees that request (a
        bucket's only request, or the first injection, would be missing from the TTFT panels)."""
        for workload, injected in workloads:
            for bucket in BUCKET_LABELS:
                self._child(workload, bucket, injected)

    def stall(self, cause: str, gap_s: float) -> None:
        count, seconds = self._stall_children[cause]
        count.inc()
        seconds.inc(gap_s)

    def set_run_info(self, **labels: str) -> None:
        self.run_info.clear()
        self.run_info.labels(*(labels.get(k, "") for k in RUN_INFO_LABELS)).set(1)
