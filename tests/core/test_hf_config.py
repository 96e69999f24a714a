"""config.json reading: counts must be whole numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from itlbench.core.hf_config import model_config_from_hf
from itlbench.errors import ConfigError

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu"}


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_key_value_heads", "hidden_size", "vocab_size"])
def test_a_fractional_count_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_config_from_hf({**LLAMA, key: 32.5}, Path("m"))
    assert err.value.field == f"config.json {key}"


def test_whole_counts_written_as_floats_are_read() -> None:
    assert model_config_from_hf({**LLAMA, "num_hidden_layers": 32.0}, Path("m")).num_layers == 32


# Dense Llama-shaped families, built by transformers itself from the published shapes, read back, and counted
# against transformers' own model on the meta device: a parameter count nobody here wrote.
PUBLISHED = {
    # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    "Qwen2.5-7B": ("Qwen2Config", dict(
        vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=131_072, sliding_window=131_072, max_window_layers=28,
        use_sliding_window=False, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=151_643, eos_token_id=151_643)),
    # huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json (tied embeddings)
    "Qwen2.5-0.5B": ("Qwen2Config", dict(
        vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32_768, sliding_window=32_768, max_window_layers=24,
        use_sliding_window=False, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    # huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json
    "Mistral-7B-v0.3": ("MistralConfig", dict(
        vocab_size=32_768, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32_768, sliding_window=None, rope_theta=1_000_000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (head_dim given: 32 heads x 128 = hidden 4096)
    "Qwen3-8B": ("Qwen3Config", dict(
        vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960, max_window_layers=36,
        use_sliding_window=False, sliding_window=None, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        attention_bias=False, tie_word_embeddings=False, bos_token_id=151_643, eos_token_id=151_645)),
    # huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json (16 heads x head_dim 128 = 2048, twice the hidden size)
    "Qwen3-0.6B": ("Qwen3Config", dict(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960, max_window_layers=28,
        use_sliding_window=False, sliding_window=None, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        attention_bias=False, tie_word_embeddings=True)),
}
FAMILY = {"Qwen2Config": "qwen2", "MistralConfig": "mistral", "Qwen3Config": "qwen3"}


def _transformers_config(name: str) -> Any:
    import transformers

    cls, shape = PUBLISHED[name]
    return getattr(transformers, cls)(**shape)


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_mistral_and_qwen_shapes_read_to_transformers_parameter_count(name: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    hf = _transformers_config(name)
    cfg = model_config_from_hf(hf.to_dict(), Path(name))
    with torch.device("meta"):
        reference = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf).parameters())
    assert cfg.num_params == reference  # Qwen2's q/k/v biases and Qwen3's q/k norms included
    shape = PUBLISHED[name][1]
    assert cfg.family == FAMILY[PUBLISHED[name][0]] and cfg.sliding_window is None
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == (
        shape["num_hidden_layers"], shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"],
        shape["intermediate_size"])
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    assert cfg.head_dim == head_dim and cfg.tie_word_embeddings == shape["tie_word_embeddings"]
    assert cfg.max_position_embeddings == shape["max_position_embeddings"] and cfg.rope_theta == 1_000_000.0


def test_the_published_qwen2_file_unused_window_is_no_window() -> None:
    """Qwen2.5's config.json says sliding_window 131072 beside use_sliding_window false: no layer slides."""
    raw = {**_transformers_config("Qwen2.5-7B").to_dict(), "sliding_window": 131_072, "architectures": ["Qwen2ForCausalLM"]}
    raw.pop("layer_types")
    assert model_config_from_hf(raw, Path("m")).sliding_window is None
    assert model_config_from_hf({**raw, "use_sliding_window": True}, Path("m")).sliding_window is None  # 28 of 28
    assert model_config_from_hf({**raw, "use_sliding_window": True, "max_window_layers": 14},
                                Path("m")).sliding_window == 131_072


def test_the_cost_model_counts_qwen_extras_as_small_parameters() -> None:
    from itlbench.sim.roofline import CostModel

    cm = CostModel(model_config_from_hf(_transformers_config("Qwen2.5-7B").to_dict(), Path("m")))
    assert cm.params == cm.layer_linear_params + cm.norm_params + 2 * cm.table_params
    assert cm.norm_params == (2 * 3584 + 28 * 128 + 2 * 4 * 128) * 28 + 3584  # norms and q/k/v biases


@pytest.mark.parametrize(("cls", "key"), [("MixtralConfig", "num_local_experts"), ("Qwen2MoeConfig", "num_experts"),
                                          ("Qwen3MoeConfig", "num_local_experts"), ("DeepseekV2Config", "n_routed_experts"),
                                          ("DeepseekV3Config", "n_routed_experts")])
def test_mixture_of_experts_models_are_refused_naming_the_experts(cls: str, key: str) -> None:
    import transformers

    raw = getattr(transformers, cls)().to_dict()
    with pytest.raises(ConfigError) as err:
        model_config_from_hf(raw, Path("m"))
    assert err.value.field == f"config.json {key}" and "mixture-of-experts" in str(err.value)
    assert "dense layers only" in str(err.value) and "\n" not in str(err.value)


def test_experts_are_refused_whatever_the_model_type_says() -> None:
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        model_config_from_hf({**LLAMA, "model_type": "qwen2", "architectures": None, "num_experts": 4}, Path("m"))


def test_families_the_cost_model_does_not_price_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        model_config_from_hf({**LLAMA, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}, Path("m"))
    assert err.value.field == "config.json model_type" and "--engine sim" in str(err.value)


def test_a_window_shorter_than_the_context_is_refused_for_the_simulator() -> None:
    from itlbench.core.engine import resolve_max_model_len
    from itlbench.core.engine_config import EngineConfig

    # huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json: every layer attends over 4096 tokens
    v01 = {**_transformers_config("Mistral-7B-v0.3").to_dict(), "sliding_window": 4096, "vocab_size": 32_000,
           "rope_theta": 10_000.0}
    cfg = model_config_from_hf(v01, Path("m"))
    assert cfg.sliding_window == 4096
    with pytest.raises(ConfigError) as err:
        resolve_max_model_len(EngineConfig(model="m", engine="sim"), cfg)
    assert err.value.field == "config.json sliding_window" and "--max-model-len 4096" in err.value.fix
    assert resolve_max_model_len(EngineConfig(model="m", engine="sim", max_model_len=4096), cfg) == 4096
    import transformers

    qwen = transformers.Qwen2Config(**{**PUBLISHED["Qwen2.5-7B"][1], "use_sliding_window": True, "sliding_window": 4096,
                                       "max_window_layers": 14})
    sliding = model_config_from_hf(qwen.to_dict(), Path("q"))
    assert sliding.sliding_window == 4096  # transformers' layer_types: layers 14-27 slide
    with pytest.raises(ConfigError, match="sliding_window"):
        resolve_max_model_len(EngineConfig(model="q", engine="sim", max_model_len=8192), sliding)


def test_the_bundled_engine_refuses_other_families_and_export_writes_llama_only() -> None:
    from itlbench.core.hf_config import hf_config_dict, require_engine_family

    qwen = model_config_from_hf(_transformers_config("Qwen3-8B").to_dict(), Path("Qwen3-8B"))
    with pytest.raises(ConfigError) as err:
        require_engine_family(qwen)
    assert err.value.field == "config.json model_type" and "--engine sim" in err.value.fix
    require_engine_family(model_config_from_hf(LLAMA, Path("m")))
    with pytest.raises(ConfigError, match="Llama"):
        hf_config_dict(qwen)
