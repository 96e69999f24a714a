"""Greedy output through each attention backend equals the independent full-recompute reference.

Triton runs in its CPU interpreter; flash runs against the documented-semantics stand-in of
test_attention_select (flash-attn itself needs a GPU; benchmarks/gpu_check.sh runs the real one).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from itlbench.engine.attention import FLASH_BLOCK_SIZE  # noqa: E402
from tests.support.models import TIED, TINY, expected, make_engine, prompts, run_staggered  # noqa: E402

torch.set_num_threads(1)
LENS = (1, 15, 16, 17, 40)  # partial, exactly full and multi-block prompts


@pytest.mark.parametrize("cfg", [TINY, TIED], ids=["tiny-gqa2", "tied-gqa4"])
@pytest.mark.parametrize("budget", [None, 7])
def test_triton_greedy_matches_reference(cfg: object, budget: int | None) -> None:
    engine = make_engine(cfg, chunk_budget=budget, attention="triton", max_num_seqs=8)
    assert engine.config.attention == "triton" and engine.runner.backend.name == "triton"
    ps = prompts(cfg, LENS)
    for p, out in zip(ps, run_staggered(engine, ps), strict=True):
        assert out == expected(cfg, tuple(p)), f"prompt length {len(p)}"
    phases = {r.phase for r in engine.step_log.since(0)}
    assert "decode" in phases and (budget is None or "mixed" in phases)
    assert not any(r.cuda_graph for r in engine.step_log.since(0))  # no graphs off CUDA


def test_flash_greedy_matches_reference(fake_flash: None) -> None:  # noqa: F811 - fixture
    engine = make_engine(TINY, chunk_budget=7, attention="flash", kv_blocks=190)
    # the default block size became flash-attn's 256, and the engine says so in its config;
    # --kv-blocks keeps its token capacity (190 blocks of 16 tokens: 12 of 256)
    assert engine.config.attention == "flash" and engine.config.block_size == FLASH_BLOCK_SIZE
    assert engine.runner.num_blocks == engine.block_manager.num_blocks == 12
    ps = prompts(TINY, LENS)
    for p, out in zip(ps, run_staggered(engine, ps), strict=True):
        assert out == expected(TINY, tuple(p)), f"prompt length {len(p)}"


def test_auto_on_cpu_records_sdpa() -> None:
    engine = make_engine(TINY)
    assert engine.config.attention == "sdpa" and engine.config.block_size == 16
