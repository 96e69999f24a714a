"""All-reduce times engines measured in 2025, and the interpolation a profile that carries them is priced by.

NVIDIA's aiconfigurator (ai-dynamo/aiconfigurator, commit 095f58a) times one 16-bit all-reduce of each engine on 2, 4
and 8 GPUs of one server (`aic-core/src/aiconfigurator_core/systems/data/{gpu}/comm/vllm/{version}/
custom_allreduce_perf.parquet`, replayed in a CUDA graph, the median of its repeats). Against those tables the presets'
all-reduce (the link's fixed cost plus the message at the ring's or the switch's share of the link) is 20-68 % fast for
messages of 128 KiB-32 MiB, a prefill chunk's activations, on every NVLink GPU (benchmarks/aic_allreduce.py,
docs/perf/sim-vs-published.md): an engine switches kernels (one-shot, two-shot, NCCL) as messages grow, and none of
them reaches the link's share until hundreds of MiB. The `-2025` profiles carry vLLM's table instead. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Message sizes the tables hold: 128 x 4^i 16-bit elements (256 B to 1 GiB)
MESSAGE_BYTES = tuple(2 * 128 * 4 ** i for i in range(12))
# GPU: (the engine measured, {degree: microseconds at each of MESSAGE_BYTES})
ALLREDUCE_2025_US: dict[str, tuple[str, dict[int, tuple[float, ...]]]] = {
    "h100": ("vLLM 0.24.0", {2: (4.29, 4.18, 4.3, 4.49, 4.52, 5.18, 8.34, 20.2, 81.4, 307, 885, 3220), 4: (4.59, 4.55, 4.7, 4.83, 5.23, 7.18, 12.8, 30.2, 98.8, 330, 1180, 4540), 8: (4.71, 4.61, 5.55, 5.31, 6.41, 10.8, 15, 30.8, 92.4, 344, 1090, 4010)}),
    "h200": ("vLLM 0.24.0", {2: (4.38, 4.42, 4.45, 4.55, 4.82, 5.19, 8.43, 20.5, 76.6, 281, 887, 3250), 4: (4.43, 4.48, 4.56, 4.82, 5.39, 6.99, 12.1, 29.8, 93.8, 320, 1180, 4520), 8: (4.71, 4.71, 4.8, 5.15, 6.56, 10.1, 14.1, 28.4, 87.2, 323, 1050, 4000)}),
    "b200": ("vLLM 0.24.0", {2: (6.59, 6.87, 6.97, 7.1, 7.08, 7.66, 13.1, 33.7, 57.4, 155, 529, 1900), 4: (6.86, 6.98, 7.14, 7.36, 7.4, 8.63, 18.4, 30, 68, 187, 681, 2510), 8: (7.42, 8.22, 7.79, 8.07, 8.64, 25.8, 17.2, 26.3, 63.2, 223, 715, 2600)}),
    "a100": ("vLLM 0.14.0", {2: (4.87, 4.89, 5.02, 5.34, 5.5, 6.57, 10.7, 25.2, 126, 388, 1430, 5390), 4: (5.15, 5.22, 5.33, 6, 6.57, 9.91, 18.3, 41.5, 182, 540, 1920, 7300), 8: (5.66, 5.78, 14.8, 6.54, 8.43, 17.1, 21.7, 45.4, 214, 594, 2170, 8250)}),
    "l40s": ("vLLM 0.22.0", {2: (5.4, 5.32, 5.58, 6.22, 9.86, 18.1, 60.2, 229, 892, 3540, 14100, 56000), 4: (13.3, 13.5, 14.1, 17.5, 36.9, 116, 361, 1650, 6680, 27200, 108000, 431000), 8: (25, 25.5, 26.7, 27.4, 72.9, 207, 583, 4010, 15800, 60100, 240000, 961000)}),
}


def lower_envelope(seconds: Sequence[float]) -> tuple[float, ...]:
    """Each time no more than any larger message's: a few sizes measured slower than the next one up (the A100 at TP8,
    8 KiB: 14.8 us between 5.8 and 6.5) are noise or a poor kernel choice an engine can avoid by padding."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return tuple(out)


def measured_tables(gpu: str) -> dict[str, tuple[tuple[float, float], ...]]:
    """{degree: ((message bytes, seconds), ...)} of `gpu`'s table, as a profile's `allreduce_measured` holds it."""
    _, by_tp = ALLREDUCE_2025_US[gpu]
    return {str(tp): tuple(zip(MESSAGE_BYTES, lower_envelope([u * 1e-6 for u in us]), strict=True))
            for tp, us in by_tp.items()}


def interpolate(points: Sequence[tuple[float, float]], message_bytes: float) -> float:
    """Seconds for a message of `message_bytes` from measured (bytes, seconds) points sorted by size: log-log between
    two points, the smallest's time below them (a fixed cost), and past the largest the last two points' bandwidth."""
    if message_bytes <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
        if message_bytes <= b1:
            f = math.log(message_bytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    (b0, t0), (b1, t1) = points[-2], points[-1]
    return t1 + (message_bytes - b1) * (t1 - t0) / (b1 - b0)
