"""The fused C row operators compute what transformers' Llama and torch compute, and the engine's greedy
output is the same through them as through torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from itlbench.core.engine import Engine
from itlbench.core.model_config import ModelConfig
from itlbench.engine.model.rope import rope_tables
from itlbench.engine.model.row_ops import NativeRowOps, TorchRowOps, row_ops_for
from tests.support.native import native_library, tiny_greedy


@pytest.fixture(scope="module")
def ops() -> NativeRowOps:
    k = native_library()
    return NativeRowOps(k.lib, k.openmp)


ROWS = [1, 3, 32, 300]  # 300: above the rows at which the C loops share the work between threads


@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_matches_transformers_and_adds_in_place(ops, rows) -> None:
    g = torch.Generator().manual_seed(rows)
    residual, delta = torch.randn(rows, 96, generator=g) * 3, torch.randn(rows, 96, generator=g)
    ref_norm = LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        ref_norm.weight.copy_(torch.rand(96, generator=g) + 0.5)
        expected_sum = residual + delta
        expected = ref_norm(expected_sum)
    mine = residual.clone()
    out = ops.add_rms_norm(mine, delta, ref_norm.weight.detach(), 1e-5)
    torch.testing.assert_close(mine, expected_sum, rtol=0, atol=0)
    torch.testing.assert_close(out, expected, rtol=2e-6, atol=2e-6)
    alone = ops.add_rms_norm(expected_sum.clone(), None, ref_norm.weight.detach(), 1e-5)
    torch.testing.assert_close(alone, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows", ROWS)
def test_rope_in_place_matches_transformers(ops, rows) -> None:
    cfg = ModelConfig(name="r", vocab_size=64, hidden_size=128, intermediate_size=256, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=32, max_position_embeddings=4096, rope_theta=500_000.0)
    cos_t, sin_t = rope_tables(cfg, 4096, torch.float32, "cpu")
    g = torch.Generator().manual_seed(rows)
    positions = torch.randint(0, 4096, (rows,), generator=g)
    qkv = torch.randn(rows, 4 + 2 * 2, 32, generator=g)  # q heads, k heads, v heads: rope on the first six
    cos, sin = cos_t[positions], sin_t[positions]
    full_cos, full_sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    q_ref, k_ref = apply_rotary_pos_emb(qkv[None, :, :4].transpose(1, 2), qkv[None, :, 4:6].transpose(1, 2),
                                        full_cos[None], full_sin[None])
    mine = qkv.clone()
    ops.rope_(mine, 6, cos, sin)
    torch.testing.assert_close(mine[:, :4], q_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine[:, 4:6], k_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    assert torch.equal(mine[:, 6:], qkv[:, 6:])  # V untouched
    torch_way = qkv.clone()
    TorchRowOps.rope_(torch_way, 6, cos, sin)
    torch.testing.assert_close(mine, torch_way, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 200), inter=st.integers(1, 70), scale=st.sampled_from([0.1, 3.0, 40.0, 200.0]))
def test_silu_mul_matches_torch_over_the_whole_float_range(ops, rows, inter, scale) -> None:
    gate_up = torch.randn(rows, 2 * inter) * scale  # large |x|: exp saturates on either side
    expected = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    torch.testing.assert_close(ops.silu_mul(gate_up), expected, rtol=2e-6, atol=1e-6)


def test_strided_or_non_fp32_inputs_take_the_torch_path(ops) -> None:
    x = torch.randn(8, 64, dtype=torch.float64)
    w = torch.ones(64, dtype=torch.float64)
    torch.testing.assert_close(ops.add_rms_norm(x.clone(), None, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))
    gate_up = torch.randn(64, 8).t()  # not contiguous
    torch.testing.assert_close(ops.silu_mul(gate_up), TorchRowOps.silu_mul(gate_up))


def test_kv_rows_land_in_their_slots_as_index_copy_puts_them(ops) -> None:
    kernel = native_library()
    qkv = torch.randn(5, 4 + 2 * 2, 16)  # rows of a fused QKV product: k and v are strided views
    k, v = qkv[:, 4:6], qkv[:, 6:]
    slots = torch.tensor([3, 40, 17, 0, 63])
    caches = [torch.zeros(4, 16, 2, 16) for _ in range(4)]
    assert kernel.write_kv(k, v, caches[0], caches[1], slots)
    caches[2].view(-1, 2, 16).index_copy_(0, slots, k)
    caches[3].view(-1, 2, 16).index_copy_(0, slots, v)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert not kernel.write_kv(k.double(), v.double(), caches[0].double(), caches[1].double(), slots)


def test_row_ops_are_native_only_for_cpu_fp32(ops) -> None:
    assert row_ops_for(torch.device("cpu"), torch.float32).name == "native"
    assert row_ops_for(torch.device("cpu"), torch.bfloat16).name == "torch"


def test_engine_greedy_same_through_native_and_torch_row_ops(ops) -> None:
    def torch_row_ops(engine: Engine) -> None:
        assert engine.runner.row_ops.name == "native"
        engine.runner.row_ops = TorchRowOps()
        engine.runner.native_decode = None  # its decode steps call the native operators too

    assert tiny_greedy(5) == tiny_greedy(5, torch_row_ops)
