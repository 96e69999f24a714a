"""What the tests of the native CPU library share: the library or a skip saying why, and greedy
output of the tiny preset over a chunked run, to compare one engine path with another."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.engine.cpu import native
from itlbench.serving.build import create_engine

TINY_CHUNKED = EngineConfig(model="tiny", device="cpu", chunk_budget=37, kv_blocks=256, max_model_len=1024)


def native_library() -> native.PagedDecodeKernel:
    """The built library, or skip the test with the reason it did not build."""
    kernel = native.load()
    if kernel is None:
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    return kernel


def tiny_greedy(seed: int, configure: Callable[[Engine], object] | None = None,
                max_tokens: int = 12) -> list[list[int]]:
    """Greedy tokens of five prompts (1 to 600 tokens, so prefill is chunked and decode batches mix
    lengths), one thread; `configure` may swap a part of the engine first."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, PRESETS["tiny"].vocab_size, n).tolist() for n in (1, 17, 90, 250, 600)]
    engine = create_engine(TINY_CHUNKED)
    if configure is not None:
        configure(engine)
    return engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
