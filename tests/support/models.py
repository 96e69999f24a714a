"""Small models, their seeded prompts and a full-recompute reference, shared by the engine tests."""

from __future__ import annotations

import functools

import numpy as np
import torch

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.engine.model.llama import LlamaForCausalLM
from itlbench.engine.model.loader import hf_state_dict, init_dummy_weights
from itlbench.serving.build import create_engine
from tests.support.reference import reference_greedy

TINY = PRESETS["tiny"]
# Tied embeddings, one KV head (GQA 4:1), wider heads, plain RoPE, 3 layers.
TIED = ModelConfig(name="tied", vocab_size=300, hidden_size=96, intermediate_size=200, num_layers=3,
                   num_heads=4, num_kv_heads=1, head_dim=32, max_position_embeddings=1024,
                   rope_theta=10_000.0, tie_word_embeddings=True)
PROMPT_LENS = (1, 2, 15, 16, 17, 31, 33, 100, 257)
NEW_TOKENS = 5
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
LOGIT_ATOL = 1e-4  # fp32; observed differences are ~1e-6


def make_engine(cfg: ModelConfig, **kw: object) -> Engine:
    base = dict(model=cfg.name, kv_blocks=512, block_size=16, max_model_len=1024, seed=0)
    base.update(kw)
    return create_engine(EngineConfig(**base), cfg)  # type: ignore[arg-type]


@functools.cache
def weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    model = LlamaForCausalLM(cfg)
    init_dummy_weights(model, seed=0)
    return hf_state_dict(model)


def prompts(cfg: ModelConfig, lens: tuple[int, ...] = PROMPT_LENS, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, cfg.vocab_size, n).tolist() for n in lens]


@functools.cache
def expected(cfg: ModelConfig, prompt: tuple[int, ...]) -> list[int]:
    return reference_greedy(weights(cfg), cfg, list(prompt), NEW_TOKENS)


def run_staggered(engine: Engine, ps: list[list[int]]) -> list[list[int]]:
    """Half the prompts arrive while the first half is already decoding, to force mixed steps."""
    first = [engine.add_request(p, GREEDY) for p in ps[::2]]
    for _ in range(3):
        engine.step()
    rest = [engine.add_request(p, GREEDY) for p in ps[1::2]]
    while engine.has_unfinished():
        engine.step()
    reqs = [None] * len(ps)
    reqs[::2], reqs[1::2] = first, rest
    return [r.output_token_ids for r in reqs]
