"""Histogram buckets of the latency metrics, shared by the engine server's and the client's Prometheus
metrics so one dashboard reads both (and vLLM's: every vLLM bucket is here too)."""

from __future__ import annotations

_FINE = (0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075)
_VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0)
_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
              10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# Sub-millisecond resolution first, then every vLLM bucket, so vLLM panels work unchanged.
LATENCY_BUCKETS: tuple[float, ...] = tuple(sorted(set(_FINE + _VLLM_ITL + _VLLM_TTFT)))
