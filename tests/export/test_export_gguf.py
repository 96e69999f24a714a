"""GGUF export: the Q/K permutation and RoPE factors are right, the file reads back, and (where
llama-server is built) llama.cpp's greedy tokens equal the bundled engine's."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import gguf  # in the test extra: these tests never skip in CI
import numpy as np
import pytest
import torch

from itlbench.core.presets import PRESETS
from itlbench.engine.model.rope import inv_frequencies
from itlbench.export.gguf import export_gguf, llama3_rope_factors, permute_rope_rows


def rope_half(x: np.ndarray, ang: np.ndarray) -> np.ndarray:
    """Hugging Face layout: pairs (i, i + D/2)."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)


def rope_pairs(x: np.ndarray, ang: np.ndarray) -> np.ndarray:
    """llama.cpp's LLAMA layout: pairs (2i, 2i + 1)."""
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., 1::2] = b * np.cos(ang) + a * np.sin(ang)
    return out


def test_permuted_projection_gives_the_same_attention_scores() -> None:
    rng = np.random.default_rng(0)
    heads, d, width = 4, 8, 16
    wq, wk = rng.normal(size=(heads * d, width)), rng.normal(size=(heads * d, width))
    xq, xk = rng.normal(size=width), rng.normal(size=width)
    ang_q, ang_k = 3 * rng.random(d // 2), 5 * rng.random(d // 2)

    def scores(wq: np.ndarray, wk: np.ndarray, rope) -> np.ndarray:
        q = rope((wq @ xq).reshape(heads, d), ang_q)
        k = rope((wk @ xk).reshape(heads, d), ang_k)
        return (q * k).sum(-1)

    hf = scores(wq, wk, rope_half)
    ours = scores(permute_rope_rows(wq, heads), permute_rope_rows(wk, heads), rope_pairs)
    np.testing.assert_allclose(ours, hf, rtol=1e-12, atol=1e-12)
    assert not np.allclose(scores(wq, wk, rope_pairs), hf)  # unpermuted rows would be wrong


def test_llama3_factors_divide_plain_frequencies_into_scaled_ones() -> None:
    cfg = PRESETS["cpu-small"]
    base = inv_frequencies(cfg.head_dim, cfg.rope_theta, None).numpy()
    scaled = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).numpy()
    f = llama3_rope_factors(cfg)
    assert f.shape == (cfg.head_dim // 2,) and f.dtype == np.float32
    np.testing.assert_allclose(base / f, scaled, rtol=1e-6)
    assert f[0] == 1.0 and f[-1] == cfg.rope_scaling.factor


def test_gguf_reads_back(tmp_path: Path) -> None:
    cfg = PRESETS["tiny"]
    out = export_gguf("tiny", tmp_path / "tiny.gguf").path
    r = gguf.GGUFReader(str(out))

    def field(name: str):
        f = r.fields[name]
        return f.contents()

    assert field("general.architecture") == "llama"
    assert field("llama.block_count") == cfg.num_layers
    assert field("llama.attention.head_count_kv") == cfg.num_kv_heads
    assert field("llama.attention.key_length") == cfg.head_dim
    assert field("llama.rope.dimension_count") == cfg.head_dim
    assert field("tokenizer.ggml.model") == "gpt2"
    assert len(field("tokenizer.ggml.tokens")) == cfg.vocab_size
    assert field("tokenizer.ggml.bos_token_id") == cfg.bos_token_id
    assert field("tokenizer.ggml.add_bos_token") is False
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "rope_freqs.weight", "blk.1.attn_q.weight"} <= names
    q = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    assert tuple(int(n) for n in q.shape) == (cfg.hidden_size, cfg.num_heads * cfg.head_dim)  # innermost first
    with pytest.raises(Exception, match="exists"):
        export_gguf("tiny", out)


def _llamacpp():
    from benchmarks.peers.llamacpp_server import llamacpp_executable

    return llamacpp_executable()


@pytest.mark.e2e
@pytest.mark.skipif(_llamacpp() is None, reason="llama-server not built (benchmarks/peers/install_llamacpp.sh)")
def test_llamacpp_greedy_tokens_equal_the_bundled_engines(tmp_path: Path) -> None:
    from benchmarks.peers.llamacpp_server import LlamaCppConfig, LlamaCppServer
    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.request import SamplingParams
    from itlbench.serving.build import create_engine

    torch.set_num_threads(1)
    path = export_gguf("cpu-small", tmp_path / "cpu-small.gguf").path
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 8192, n).tolist() for n in (6, 300, 3000)]
    ours = create_engine(EngineConfig(model="cpu-small", chunk_budget=256, max_model_len=4096, kv_blocks=1024))
    expected = ours.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    with LlamaCppServer(LlamaCppConfig(model_path=path, chunk_budget=256, n_parallel=1, ctx_size=4096,
                                       cache_prompt=False, log_path=tmp_path / "llamacpp.log")) as srv:
        got = []
        for p in prompts:
            body = {"prompt": p, "n_predict": 8, "temperature": 0.0, "ignore_eos": True, "return_tokens": True}
            req = urllib.request.Request(f"{srv.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as resp:
                got.append(json.loads(resp.read())["tokens"])
    assert got == expected
