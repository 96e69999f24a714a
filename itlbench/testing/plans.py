"""Plans for measuring the client itself: fixed-size requests with no workload behind them.

Importable by name, so a Locust job can name one as its plan factory (`itlbench.testing.plans:fixed_streams`).
"""

from __future__ import annotations

from collections.abc import Iterator

from itlbench.workloads.plan import LoadPlan, RequestPlan


def _stream(k: int, tokens: int, prefix: str) -> Iterator[RequestPlan]:
    i = 0
    while True:
        yield RequestPlan(f"{prefix}{k}-{i}", "fidelity", "fidelity", 4, tokens, prompt_token_ids=(1, 2, 3, 4),
                          prompt_text="a b c d")
        i += 1


def fixed_streams(streams: int, tokens: int, prefix: str = "s") -> LoadPlan:
    """`streams` closed-loop streams of endless identical requests, each generating `tokens` tokens."""
    return LoadPlan(streams=[_stream(k, tokens, prefix) for k in range(streams)])
