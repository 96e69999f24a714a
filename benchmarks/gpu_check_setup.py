"""The GPU check's shapes: the GPU run's (Llama-3.1-8B, bf16, CUDA) and the dry run's (tiny model, fp32, CPU).

Apart from `gpu_check.py` so that its sections and `gpu_check_scenario.py` share it with imports that run one way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS


@dataclass
class Setup:
    dry_run: bool
    device: torch.device
    dtype: torch.dtype
    model: ModelConfig
    decode_batches: tuple[int, ...]
    decode_context: int
    decode_steps: int
    prefill_lens: tuple[int, ...]
    max_model_len: int
    kv_memory_gib: float


def setup(dry_run: bool) -> Setup:
    if dry_run:  # 2 decode steps: 6 tokens a request, 5 decode steps, the median skips the first 2 as on the GPU
        return Setup(True, torch.device("cpu"), torch.float32, PRESETS["tiny"], (1, 4), 64, 2, (128, 512), 1024, 0.05)
    return Setup(False, torch.device("cuda"), torch.bfloat16, PRESETS["llama-3.1-8b"], (1, 32), 2048, 40,
                 (2048, 32768), 40_960, 24.0)
