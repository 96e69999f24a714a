"""Where a step's time goes: the StepRecord split, hand-off time from a serving driver, context tokens,
and the CPU layout of the projection weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.engine.cpu import native
from itlbench.engine.cpu import weights as cpu_weights
from itlbench.engine.cpu.weights import (
    PACK_MIN_ELEMENTS,
    PACKED,
    PanelGemm,
    pack_projections,
    packed_max_rows,
    project,
)
from itlbench.engine.model.llama import LlamaForCausalLM
from itlbench.serving.build import create_engine
from tests.support.models import TIED

CFG = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=512, seed=0)
PARTS = ("schedule_ns", "prepare_ns", "forward_ns", "sample_ns", "output_ns")


def test_step_split_adds_up_and_counts_context() -> None:
    torch.set_num_threads(1)
    engine = create_engine(CFG)
    sp = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    engine.add_request(list(range(3, 23)), sp)  # 20 prompt tokens
    engine.add_request(list(range(3, 103)), sp)  # 100: chunked, 44 in the first step
    while engine.has_unfinished():
        engine.step()
    records = engine.step_log.since(0)
    for r in records:
        parts = [getattr(r, p) for p in PARTS]
        assert all(p > 0 for p in parts), r
        assert sum(parts) <= r.end_ns - r.start_ns
        assert r.handoff_ns == 0  # nothing but this loop drives the engine
    first, second = records[:2]
    assert (first.prefill_tokens, first.context_tokens) == (64, 0)  # nothing cached yet
    assert second.context_tokens == 20 + 44  # the first prompt decodes after 20, the second goes on after 44


def test_context_tokens_grow_by_one_per_decode() -> None:
    engine = create_engine(CFG)
    engine.add_request(list(range(3, 13)), SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert [(r.phase, r.context_tokens) for r in engine.step_log.since(0)] == [
        ("prefill", 0), ("decode", 10), ("decode", 11)]


def test_driver_handoff_lands_on_the_next_step_only() -> None:
    engine = create_engine(CFG)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    engine.note_handoff(12_345)
    engine.step()
    engine.step()
    a, b, c = engine.step_log.since(0)
    assert (a.handoff_ns, b.handoff_ns, c.handoff_ns) == (0, 12_345, 0)


@pytest.fixture
def without_panels(monkeypatch):
    """The machine without the native library: oneDNN, or column-major, as the fallbacks."""
    monkeypatch.setattr(cpu_weights, "panel_gemm", lambda: None)


def test_cpu_projections_are_packed_in_panels_and_multiply_as_f_linear(monkeypatch) -> None:
    if native.load() is None:
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    engine = create_engine(CFG.with_(model="cpu-small"))
    model = engine.runner.model
    assert engine.runner.weight_layout == "panels"
    packed = {name for name, p in model.named_parameters() if getattr(p, PACKED, None) is not None}
    assert packed == {name for name, p in model.named_parameters() if p.dim() == 2} - {"embed_tokens"}
    w = model.layers[0].mlp.gate_up_proj
    gemm = getattr(w, PACKED).multiply
    assert isinstance(gemm, PanelGemm)
    seen: list[int] = []
    real = gemm._gemm

    def spy(*args):
        seen.append(args[5])  # M
        return real(*args)

    monkeypatch.setattr(gemm, "_gemm", spy)
    for rows in (1, 7, 32, 256, 2048):
        x = torch.randn(rows, w.shape[1])
        torch.testing.assert_close(project(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert seen == [1, 7, 32, 256, 2048]  # prefill-sized products too


def test_large_cpu_projections_are_packed_for_onednn_and_all_multiply_as_f_linear(without_panels) -> None:
    engine = create_engine(CFG.with_(model="cpu-small"))
    model = engine.runner.model
    assert engine.runner.weight_layout == "onednn"
    packed = {name for name, p in model.named_parameters() if getattr(p, PACKED, None) is not None}
    large = {name for name, p in model.named_parameters() if p.dim() == 2 and p.numel() >= PACK_MIN_ELEMENTS}
    assert packed == large - {"embed_tokens"} and "lm_head" in packed
    assert "layers.0.self_attn.qkv_proj" not in packed and "layers.0.mlp.gate_up_proj" in packed
    for w in (model.layers[0].mlp.gate_up_proj, model.layers[0].self_attn.qkv_proj):
        for rows in (1, 8, 300):
            x = torch.randn(rows, w.shape[1])
            torch.testing.assert_close(project(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_only_decode_sized_products_go_through_onednn(monkeypatch, without_panels) -> None:
    """oneDNN pins memory for every row count it has seen: prefill-sized products must not reach it."""
    engine = create_engine(CFG.with_(model="cpu-small"))
    w = engine.runner.model.layers[0].mlp.gate_up_proj
    cap = getattr(w, PACKED).max_rows
    assert cap == 64
    seen: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x, *args):
        seen.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    for rows in (1, cap, cap + 1, 700):
        x = torch.randn(rows, w.shape[1])
        torch.testing.assert_close(project(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert seen == [1, cap]


def test_the_packed_row_cap_keeps_onednn_cache_within_its_budget() -> None:
    small = {(1536, 256), (256, 768), (8192, 256)}
    assert packed_max_rows(small, 4) == 64  # cpu-small: capped by the largest decode batch
    llama_8b = {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)}
    cap = packed_max_rows(llama_8b, 4)
    assert 1 <= cap < 64
    assert cap * (cap + 1) // 2 * sum(out for out, _ in llama_8b) * 4 <= 128 << 20


def test_a_model_of_small_weights_stays_row_major(without_panels) -> None:
    engine = create_engine(CFG)
    assert engine.runner.weight_layout == "row-major"
    assert all(getattr(p, PACKED, None) is None for p in engine.runner.model.parameters())


def test_tied_head_is_packed_beside_the_embedding_it_shares() -> None:
    model = LlamaForCausalLM(dataclasses.replace(TIED, vocab_size=1024))  # a head large enough to pack
    with torch.no_grad():
        model.embed_tokens.normal_()
    assert pack_projections(model) == "onednn"
    assert model.lm_head is None and getattr(model.embed_tokens, PACKED, None) is not None
    ids = torch.tensor([3, 9])
    torch.testing.assert_close(F.embedding(ids, model.embed_tokens)[1], model.embed_tokens[9])


def test_without_onednn_the_projections_are_column_major(monkeypatch, without_panels) -> None:
    monkeypatch.setattr(cpu_weights, "_onednn_packs", lambda weight: False)
    engine = create_engine(CFG)
    model = engine.runner.model
    assert engine.runner.weight_layout == "column-major"
    proj = model.layers[0].mlp.gate_up_proj
    assert proj.t().is_contiguous() and not proj.is_contiguous() and getattr(proj, PACKED, None) is None
    assert model.embed_tokens.is_contiguous()  # indexed by row
