"""Model directories written by transformers serve exactly what transformers computes.

transformers builds small random Llamas (GQA ratios 1 and 4, tied and untied embeddings, llama3,
linear and no RoPE scaling, head_dim given and derived) and saves each in its current layout
(`rope_parameters`) and in the older one (top-level `rope_theta` + `rope_scaling`, derivable keys
such as head_dim left out). The bundled engine, loaded from each directory, must produce
transformers' greedy tokens (`generate`) and its last-prompt-position logits within LOGIT_ATOL,
unchunked and at a small chunk budget, for prompts that run past the scaling's original context.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig, RopeScaling
from itlbench.core.presets import load_model_config
from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError
from itlbench.serving.build import create_engine

torch.set_num_threads(1)

VOCAB = 320
MAX_POSITIONS = 256
PROMPT_LENS = (5, 37, 150)  # 150 crosses every original context below
NEW_TOKENS = 6
BUDGETS = (None, 16)
# fp32 on both sides (RoPE angles in fp64 in the engine, fp32 in transformers): observed differences
# are at most 4e-6; the smallest top-1/top-2 logit margin among these prompts is 0.025.
LOGIT_ATOL = 1e-4
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def llama3(original: int) -> dict[str, Any]:
    return {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": original}


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    hidden: int
    head_dim: int | None  # None: transformers derives hidden // heads and config.json still states it
    tied: bool
    rope: dict[str, Any]


SHAPES = (
    Shape("gqa1-untied-llama3", heads=4, kv_heads=4, hidden=64, head_dim=None, tied=False, rope=llama3(48)),
    Shape("gqa4-tied-llama3-headdim", heads=8, kv_heads=2, hidden=64, head_dim=16, tied=True, rope=llama3(32)),
    Shape("gqa4-untied-plain-headdim", heads=4, kv_heads=1, hidden=48, head_dim=24, tied=False,
          rope={"rope_type": "default", "rope_theta": 500_000.0}),
    Shape("gqa1-tied-linear", heads=2, kv_heads=2, hidden=32, head_dim=None, tied=True,
          rope={"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}),
)
LAYOUTS = ("rope_parameters", "rope_scaling")


def to_older_layout(raw: dict[str, Any]) -> dict[str, Any]:
    """Older files' spelling of the same model: top-level rope_theta, rope_scaling (or null), linear
    scaling under the oldest key `type`, and head_dim / num_key_value_heads left out where derived."""
    out = dict(raw)
    if out["head_dim"] == out["hidden_size"] // out["num_attention_heads"]:
        del out["head_dim"]
    if out["num_key_value_heads"] == out["num_attention_heads"]:
        del out["num_key_value_heads"]
    rope = dict(out.pop("rope_parameters"))
    out["rope_theta"] = rope.pop("rope_theta")  # the only θ left in the file
    if rope["rope_type"] == "linear":
        rope["type"] = rope.pop("rope_type")
    out["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("hf")
    dirs: dict[tuple[str, str], Path] = {}
    for i, s in enumerate(SHAPES):
        torch.manual_seed(i)
        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=s.hidden, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
            max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=s.tied, rope_parameters=dict(s.rope),
            # Weights of std 1/sqrt(d) keep activations O(1) and greedy choices well separated.
            initializer_range=s.hidden ** -0.5, bos_token_id=1, eos_token_id=2)
        new = root / s.name / "rope_parameters"
        LlamaForCausalLM(config).save_pretrained(new)
        raw = json.loads((new / "config.json").read_text())
        assert "rope_theta" in raw["rope_parameters"] and "rope_scaling" not in raw  # the current layout
        old = root / s.name / "rope_scaling"
        shutil.copytree(new, old)
        (old / "config.json").write_text(json.dumps(to_older_layout(raw)))
        dirs[s.name, "rope_parameters"], dirs[s.name, "rope_scaling"] = new, old
    return dirs


def prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in PROMPT_LENS]


@functools.cache
def transformers_reference(directory: str, seed: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens from `generate` and last-prompt-position logits, one prompt at a time."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # the engine side ignores EOS too
    tokens, logits = [], []
    with torch.no_grad():
        for p in prompts(seed):
            ids = torch.tensor([p])
            logits.append(model(ids).logits[0, -1].float())
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=0, do_sample=False, pad_token_id=0)
            tokens.append(out[0, len(p):].tolist())
    return tokens, logits


def engine_outputs(directory: Path, budget: int | None, seed: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """All prompts at once through the engine (chunks mix with decodes); first sampled logits per request."""
    engine = create_engine(EngineConfig(model=str(directory), chunk_budget=budget, kv_blocks=64, block_size=16,
                                 max_model_len=MAX_POSITIONS, seed=0))
    first: dict[str, torch.Tensor] = {}
    sample = engine.runner.sampler

    def spy(rows: torch.Tensor, requests: list, *greedy: object) -> list[int]:
        for row, r in zip(rows, requests, strict=True):
            first.setdefault(r.request_id, row.clone())
        return sample(rows, requests, *greedy)

    engine.runner.sampler = spy  # type: ignore[assignment]
    reqs = [engine.add_request(p, GREEDY) for p in prompts(seed)]
    while engine.has_unfinished():
        engine.step()
    return [list(r.output_token_ids) for r in reqs], [first[r.request_id] for r in reqs]


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: f"budget-{b}")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_engine_matches_transformers(model_dirs: dict[tuple[str, str], Path], shape: Shape, layout: str,
                                     budget: int | None) -> None:
    directory = model_dirs[shape.name, layout]
    seed = SHAPES.index(shape)
    want_tokens, want_logits = transformers_reference(str(directory), seed)
    got_tokens, got_logits = engine_outputs(directory, budget, seed)
    assert got_tokens == want_tokens
    for n, got, want in zip(PROMPT_LENS, got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0, msg=lambda m, n=n: f"prompt {n}: {m}")


def test_both_layouts_read_the_same(model_dirs: dict[tuple[str, str], Path]) -> None:
    for s in SHAPES:
        new = load_model_config(str(model_dirs[s.name, "rope_parameters"]))
        old = load_model_config(str(model_dirs[s.name, "rope_scaling"]))
        assert new.path != old.path
        assert _shape_of(new) == _shape_of(old)
        assert new.head_dim == (s.head_dim or s.hidden // s.heads)
        old_raw = json.loads((model_dirs[s.name, "rope_scaling"] / "config.json").read_text())
        assert ("head_dim" in old_raw) == (s.head_dim is not None)
        assert (new.num_heads, new.num_kv_heads, new.tie_word_embeddings) == (s.heads, s.kv_heads, s.tied)
        assert new.rope_theta == s.rope["rope_theta"] and new.rms_norm_eps == 1e-6
        kind = s.rope["rope_type"]
        assert (new.rope_scaling.rope_type if new.rope_scaling else "default") == kind
        if kind == "llama3":
            assert new.rope_scaling == RopeScaling(
                factor=8.0, original_max_position_embeddings=s.rope["original_max_position_embeddings"])
    # The two layouts also agree inside transformers: same greedy tokens from both directories.
    s = SHAPES[0]
    assert (transformers_reference(str(model_dirs[s.name, "rope_parameters"]), 0)[0]
            == transformers_reference(str(model_dirs[s.name, "rope_scaling"]), 0)[0])


def _shape_of(cfg: ModelConfig) -> tuple[object, ...]:
    return (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling,
            cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.bos_token_id, cfg.eos_token_id)


# ----------------------------------------------------------------- what the engine refuses

YARN = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0, "original_max_position_embeddings": 64}
REFUSED = {
    "yarn": ({"rope_parameters": YARN}, "rope_parameters.rope_type", "'yarn'"),
    "longrope": ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                                      "long_factor": [2.0] * 8}}, "rope_parameters.rope_type", "'longrope'"),
    "dynamic-older-layout": ({"rope_parameters": None, "rope_theta": 1e4,
                              "rope_scaling": {"type": "dynamic", "factor": 2.0}},
                             "rope_scaling.rope_type", "'dynamic'"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act", "'gelu'"),
    "attention-bias": ({"attention_bias": True}, "attention_bias", "bias"),
    "mlp-bias": ({"mlp_bias": True}, "mlp_bias", "bias"),
    "partial-rotary": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
                       "rope_parameters.partial_rotary_factor", "0.5"),
    "llama3-incomplete": ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                                               "high_freq_factor": 4.0}},
                          "rope_parameters.low_freq_factor", "required"),
    "per-layer-rope": ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
                       "rope_parameters", "per-layer"),
    "mistral": ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "model_type", "'mistral'"),
}


def write_variant(model_dirs: dict[tuple[str, str], Path], tmp_path: Path, changes: dict[str, Any]) -> Path:
    src = model_dirs[SHAPES[0].name, "rope_parameters"]
    shutil.copytree(src, tmp_path, dirs_exist_ok=True)
    raw = json.loads((src / "config.json").read_text())
    raw.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


@pytest.mark.parametrize("case", REFUSED)
def test_unsupported_keys_are_refused_by_name(model_dirs: dict[tuple[str, str], Path], tmp_path: Path,
                                              case: str) -> None:
    changes, key, words = REFUSED[case]
    directory = write_variant(model_dirs, tmp_path, changes)
    with pytest.raises(ConfigError) as info:
        create_engine(EngineConfig(model=str(directory), kv_blocks=16))
    assert info.value.field == f"config.json {key}"
    assert words in info.value.problem


def test_cli_refuses_unsupported_rope_with_exit_2(model_dirs: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    directory = write_variant(model_dirs, tmp_path / "model", {"rope_parameters": YARN})
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", str(directory), "--out", str(out), "--duration", "1"],
                                terminal_width=200)
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "error: config.json rope_parameters.rope_type: 'yarn' is not implemented" in flat
    assert "Traceback" not in result.output and not out.exists()
