"""config.json reading: counts must be whole numbers."""

from __future__ import annotations

from pathlib import Path

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
