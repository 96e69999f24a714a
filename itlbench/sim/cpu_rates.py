"""This CPU's own roofs, measured: its best fp32 matmul rate and its best read bandwidth.

The 'cpu' hardware profile (`sim.hardware.measure_cpu`) is built from these two numbers. Uses torch
when installed (the engine's own kernels), numpy otherwise; imports nothing else of itlbench.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def measure_rates(seconds: float = 1.0) -> tuple[float, float]:
    """(fp32 FLOP/s, bytes/s read): the best matmul rate at n = 512 and 1024, the best sum over 512 MiB,
    each from repeated runs within a quarter of `seconds`."""
    import numpy as np

    try:
        import torch

        def matmul_rate(n: int) -> float:
            a, b = torch.randn(n, n), torch.randn(n, n)
            return best_rate(lambda: a @ b, 2.0 * n**3, seconds / 4)

        def read_bw(n_bytes: int) -> float:
            x = torch.ones(n_bytes // 4)
            return best_rate(x.sum, float(x.nbytes), seconds / 4)
    except ImportError:
        def matmul_rate(n: int) -> float:
            a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
            return best_rate(lambda: a @ b, 2.0 * n**3, seconds / 4)

        def read_bw(n_bytes: int) -> float:
            x = np.ones(n_bytes // 4, np.float32)
            return best_rate(x.sum, float(x.nbytes), seconds / 4)

    return max(matmul_rate(512), matmul_rate(1024)), read_bw(512 << 20)


def best_rate(fn: Callable[[], object], work: float, budget_s: float) -> float:
    """`work` over the fastest of at least three runs of `fn` (up to 50, until `budget_s` has passed)."""
    best = math.inf
    deadline = time.perf_counter() + budget_s
    for i in range(50):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return work / best
