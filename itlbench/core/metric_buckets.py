"""Histogram buckets of the latency metrics, shared by the engine server's and the client's Prometheus
metrics so client and server histograms compare bucket for bucket.

Two sets, as vLLM keeps one per kind of latency:

- `ITL_BUCKETS` (inter-token latency, engine step duration, client send lag): 0.25 ms to 80 s, with
  20 buckets a decade from 1 ms to 100 ms, each at most 17 % above the one before, where GPU decode
  steps sit. histogram_quantile interpolates linearly inside a bucket, so its error is bounded by the
  bucket's width: on a realistic ITL distribution its p50/p90/p99 stay within 10 % of the exact
  percentiles (tests/telemetry/test_metric_buckets.py). Every bucket of vLLM's inter-token-latency
  and time-per-output-token histograms is one of them.
- `REQUEST_BUCKETS` (time to first token; end-to-end, queue, prefill and decode time per request):
  1 ms to 7680 s. Every bucket of vLLM's time-to-first-token histogram and of its request-latency
  histograms (e2e, queue, inference, prefill, decode) is one of them.

So a query written for vLLM that names a bucket (`le="0.1"`) finds the same bucket here.
"""

from __future__ import annotations

# vLLM's bucket lists (vllm/v1/metrics/loggers.py), written out for the containment test and the unions below.
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0)
VLLM_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0)

# One decade in 20 steps of 7-17 %, round numbers that include vLLM's 1, 2, 2.5, 4, 5, 6, 7.5 and 8.
_DECADE = (1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.25, 2.5, 2.8, 3.2, 3.6, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 7.5, 8.0, 9.0)
_DENSE = tuple(round(m * 10.0**e, 10) for e in (-3, -2) for m in _DECADE)  # 1 ms … 90 ms
_ITL_TAIL = (0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0)  # stalls: 25-50 % steps
ITL_BUCKETS: tuple[float, ...] = tuple(sorted({0.00025, 0.0005, 0.00075, *_DENSE, *_ITL_TAIL, *VLLM_ITL}))

_REQUEST_FINE = (0.002, 0.003, 0.0075, 0.015, 0.03)
REQUEST_BUCKETS: tuple[float, ...] = tuple(sorted({*_REQUEST_FINE, *VLLM_ITL, *VLLM_TTFT, *VLLM_REQUEST}))
