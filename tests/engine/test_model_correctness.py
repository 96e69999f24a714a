"""The paged, chunked, flattened engine computes exactly what a plain full-recompute Llama does."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from itlbench.core.model_config import RopeScaling
from itlbench.core.presets import PRESETS
from itlbench.engine.model.llama import LlamaForCausalLM
from itlbench.engine.model.loader import hf_state_dict, init_dummy_weights
from itlbench.engine.model.rope import inv_frequencies
from tests.support.models import (
    GREEDY,
    LOGIT_ATOL,
    NEW_TOKENS,
    TIED,
    TINY,
    expected,
    make_engine,
    prompts,
    run_staggered,
    weights,
)
from tests.support.reference import llama3_inv_freq, reference_greedy, reference_logits

torch.set_num_threads(1)


@pytest.mark.parametrize("budget", [None, 1, 5, 16, 37, 2048])
@pytest.mark.parametrize("policy", ["budget", "prefill-first"])
def test_greedy_matches_full_recompute(budget: int | None, policy: str) -> None:
    engine = make_engine(TINY, chunk_budget=budget, policy=policy)
    ps = prompts(TINY)
    outs = run_staggered(engine, ps)
    for p, out in zip(ps, outs, strict=True):
        assert out == expected(TINY, tuple(p)), f"prompt length {len(p)}"
    phases = {r.phase for r in engine.step_log.since(0)}
    assert {"prefill", "decode"} <= phases
    if policy == "budget" and budget not in (None, 1):
        assert "mixed" in phases
    bm = engine.block_manager
    bm.check_invariants()
    assert bm.usage == 0.0 and bm.num_free_blocks == bm.num_blocks  # every finished request gave its blocks back
    # ...and every full block it computed (prompt + outputs but the last, never fed back) stays cached
    assert bm.num_cached_blocks == sum((len(p) + NEW_TOKENS - 1) // bm.block_size for p in ps)


def test_prefill_first_mixed_matches() -> None:
    engine = make_engine(TINY, chunk_budget=16, policy="prefill-first", mixed=True)
    ps = prompts(TINY)
    outs = run_staggered(engine, ps)
    assert outs == [expected(TINY, tuple(p)) for p in ps]
    assert "mixed" in {r.phase for r in engine.step_log.since(0)}


@pytest.mark.parametrize("budget", [None, 7])
def test_tied_gqa_model_matches(budget: int | None) -> None:
    engine = make_engine(TIED, chunk_budget=budget, block_size=8)
    ps = prompts(TIED, (1, 9, 40, 65), seed=2)
    outs = run_staggered(engine, ps)
    assert outs == [expected(TIED, tuple(p)) for p in ps]


@pytest.mark.parametrize("policy", ["budget", "prefill-first"])
def test_prefix_cache_hits_match(policy: str) -> None:
    engine = make_engine(TINY, chunk_budget=24, policy=policy)
    shared = prompts(TINY, (70,), seed=3)[0]
    a = shared + [7, 8, 9]
    b = shared + [10, 11]
    c = shared[:40]  # ends mid-block inside the cached prefix
    ra = engine.add_request(a, GREEDY)
    while engine.has_unfinished():
        engine.step()
    rb, rc = engine.add_request(b, GREEDY), engine.add_request(c, GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert rb.num_cached_tokens == 64 and rc.num_cached_tokens == 32
    for req, p in ((ra, a), (rb, b), (rc, c)):
        assert req.output_token_ids == expected(TINY, tuple(p))


def test_prefix_cache_off_matches() -> None:
    engine = make_engine(TINY, chunk_budget=24, prefix_caching=False)
    p = prompts(TINY, (50,), seed=4)[0]
    outs = [engine.generate([p], GREEDY)[0] for _ in range(2)]
    assert outs == [expected(TINY, tuple(p))] * 2
    assert engine.block_manager.usage == 0.0


@pytest.mark.parametrize("budget", [None, 5])
def test_first_position_logits_agree(budget: int | None) -> None:
    engine = make_engine(TINY, chunk_budget=budget)
    seen: dict[str, torch.Tensor] = {}
    sample = engine.runner.sampler

    def spy(logits: torch.Tensor, requests: list, *greedy: object) -> list[int]:
        for row, r in zip(logits, requests, strict=True):
            seen.setdefault(r.request_id, row.clone())
        return sample(logits, requests, *greedy)

    engine.runner.sampler = spy  # type: ignore[assignment]
    ps = prompts(TINY, (1, 17, 100, 257), seed=5)
    reqs = [engine.add_request(p, GREEDY) for p in ps]
    while engine.has_unfinished():
        engine.step()
    for req, p in zip(reqs, ps, strict=True):
        ref = reference_logits(weights(TINY), TINY, p)[-1]
        torch.testing.assert_close(seen[req.request_id], ref, atol=LOGIT_ATOL, rtol=0)


def test_llama3_rope_scaling_matches_formula() -> None:
    for cfg in (TINY, PRESETS["llama-3.1-8b"], PRESETS["llama-3.2-1b"], TIED):
        ours = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        torch.testing.assert_close(ours, llama3_inv_freq(cfg), rtol=1e-12, atol=0)
    # Llama-3.1-8B: highest frequency untouched, lowest divided by the factor, monotone in between.
    cfg = PRESETS["llama-3.1-8b"]
    plain = inv_frequencies(cfg.head_dim, cfg.rope_theta, None)
    scaled = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert scaled[0] == plain[0]
    assert scaled[-1] == pytest.approx(plain[-1] / 8)
    ratio = scaled / plain
    assert torch.all(ratio[1:] <= ratio[:-1] + 1e-15)


def test_unscaled_rope_is_plain_theta_powers() -> None:
    inv = inv_frequencies(8, 10_000.0, None)
    torch.testing.assert_close(inv, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64))
    scaling = RopeScaling(factor=4.0, original_max_position_embeddings=64)
    assert torch.all(inv_frequencies(8, 10_000.0, scaling) <= inv)


def test_dummy_weights_seeded_and_finite() -> None:
    def params(seed: int) -> dict[str, torch.Tensor]:
        model = LlamaForCausalLM(TINY)
        init_dummy_weights(model, seed)
        return hf_state_dict(model)

    a, b, c = params(0), params(0), params(1)
    for name, t in a.items():
        assert torch.isfinite(t).all(), name
        assert torch.equal(t, b[name]), name
        if name.endswith("norm.weight"):
            assert torch.all(t == 1), name
        else:
            assert not torch.equal(t, c[name]), name
            assert t.abs().max() <= 1.0


def test_long_context_beyond_original_rope_window() -> None:
    """Positions past the llama3 scaling's original window (256 for tiny) stay exact."""
    cfg = dataclasses.replace(TINY, name="tiny-long")
    engine = make_engine(cfg, chunk_budget=128)
    p = prompts(cfg, (600,), seed=6)[0]
    assert engine.generate([p], GREEDY)[0] == reference_greedy(weights(cfg), cfg, p, NEW_TOKENS)
