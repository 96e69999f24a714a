"""Hostile or damaged config.json files: each is refused in one line naming the file or key, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from itlbench.core.hf_config import model_config_from_hf, read_hf_config
from itlbench.core.presets import load_model_config
from itlbench.errors import ConfigError

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000,
         "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0}


def _refused_file(tmp_path: Path, data: bytes, *needles: str) -> ConfigError:
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(ConfigError) as err:
        read_hf_config(tmp_path)
    assert "\n" not in str(err.value) and err.value.fix
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    return err.value


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xff\xfe\x00garbage\x80", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
], ids=["binary", "deep"])
def test_a_config_json_that_cannot_be_read_is_refused_naming_the_file(tmp_path: Path, data: bytes,
                                                                      needle: str) -> None:
    # was: UnicodeDecodeError and RecursionError tracebacks, exit 1
    err = _refused_file(tmp_path, data, "config.json", needle)
    assert err.field == "model"


def _refused(raw: dict[str, Any], key: str, *needles: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_config_from_hf(raw, Path("m"))
    assert err.value.field == f"config.json {key}", err.value
    assert "\n" not in str(err.value) and err.value.fix
    for needle in needles:
        assert needle in err.value.problem, err.value.problem


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize(("patch", "key", "needle"), [
    ({"rms_norm_eps": "small"}, "rms_norm_eps", "'small'"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps", "nan"),
    ({"rms_norm_eps": -1e-5}, "rms_norm_eps", "-1e-05"),
    ({"rope_theta": "big"}, "rope_theta", "'big'"),
    ({"rope_theta": float("inf")}, "rope_theta", "inf"),
    ({"rope_theta": -1}, "rope_theta", "-1"),
    ({"rope_theta": True}, "rope_theta", "True"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters.rope_theta", "0"),
    ({"partial_rotary_factor": "half"}, "partial_rotary_factor", "'half'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "rope_scaling.factor", "'x'"),
    ({"rope_scaling": {**LLAMA3_ROPE, "low_freq_factor": "a"}}, "rope_scaling.low_freq_factor", "'a'"),
    ({"rope_scaling": {**LLAMA3_ROPE, "high_freq_factor": float("nan")}}, "rope_scaling.high_freq_factor", "nan"),
    ({"rope_scaling": {**LLAMA3_ROPE, "original_max_position_embeddings": "x"}},
     "rope_scaling.original_max_position_embeddings", "'x'"),
    ({"rope_scaling": {**LLAMA3_ROPE, "original_max_position_embeddings": 0}},
     "rope_scaling.original_max_position_embeddings", "is 0"),
    ({"rope_scaling": {**LLAMA3_ROPE, "high_freq_factor": 1.0}}, "rope_scaling.high_freq_factor", "not above"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
      "use_sliding_window": True, "max_window_layers": "x"}, "max_window_layers", "'x'"),
], ids=lambda v: str(v)[:40] if isinstance(v, str) else None)
def test_a_number_that_is_not_a_usable_number_is_refused_naming_its_key(patch: dict[str, Any], key: str,
                                                                         needle: str) -> None:
    # was: ValueError tracebacks (float('small')); NaN and inf passed, then the run died writing run.json with a
    # traceback and left a run directory; a negative θ or ε was simulated without a word
    _refused({**LLAMA, **patch}, key, needle)


def test_usable_numbers_are_still_read() -> None:
    cfg = model_config_from_hf({**LLAMA, "rms_norm_eps": 0, "rope_theta": "10000", "rope_scaling": LLAMA3_ROPE},
                               Path("m"))
    assert cfg.rms_norm_eps == 0.0 and cfg.rope_theta == 10_000.0
    assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
    assert cfg.rope_scaling.original_max_position_embeddings == 8192


@pytest.mark.parametrize(("patch", "key", "needle"), [
    ({"bos_token_id": "x"}, "bos_token_id", "'x'"),
    ({"bos_token_id": {"a": 1}}, "bos_token_id", "{'a': 1}"),
    ({"eos_token_id": -1}, "eos_token_id", "-1"),
    ({"eos_token_id": [2, "x"]}, "eos_token_id", "'x'"),
    ({"eos_token_id": [2, None]}, "eos_token_id", "None"),
    ({"eos_token_id": [True]}, "eos_token_id", "True"),
], ids=["str", "dict", "negative", "list-str", "list-null", "bool"])
def test_a_token_id_that_is_not_one_is_refused_naming_its_key(patch: dict[str, Any], key: str, needle: str) -> None:
    # was: int('x') and int({}) tracebacks; True read as id 1
    _refused({**LLAMA, **patch}, key, needle)


def test_token_ids_as_one_or_a_list_are_read() -> None:
    cfg = model_config_from_hf({**LLAMA, "bos_token_id": None, "eos_token_id": [128001, 128009.0]}, Path("m"))
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.extra_eos_token_ids) == (1, 128001, (128009,))


@pytest.mark.parametrize(("patch", "key", "needle"), [
    ({"architectures": 5}, "architectures", "5"),
    ({"architectures": "LlamaForCausalLM"}, "architectures", "'LlamaForCausalLM'"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "'false'"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings", "1"),
], ids=["arch-int", "arch-str", "tie-str", "tie-int"])
def test_a_key_of_the_wrong_type_is_refused_rather_than_misread(patch: dict[str, Any], key: str, needle: str) -> None:
    # was: architectures 5 a TypeError traceback; a string matched by substring; "false" tied the embeddings
    # (bool("false") is True), dropping the LM head from every parameter count
    _refused({**LLAMA, **patch}, key, needle)


@pytest.mark.parametrize(("patch", "key", "needle"), [
    ({"num_attention_heads": 0}, "num_attention_heads", "is 0"),
    ({"num_attention_heads": -4}, "num_attention_heads", "is -4"),
    ({"head_dim": 0}, "head_dim", "is 0"),
    ({"hidden_size": -2048}, "hidden_size", "is -2048"),
], ids=["zero", "negative", "head-dim-zero", "hidden-negative"])
def test_a_head_count_or_size_that_is_not_positive_is_refused_naming_its_key(patch: dict[str, Any], key: str,
                                                                             needle: str) -> None:
    # was: 0 or -4 heads told to "give head_dim explicitly" (then refused as model.num_heads); head_dim 0 taken as
    # absent; -2048 hidden blamed on head_dim (-64)
    _refused({**LLAMA, **patch}, key, needle)


def test_a_count_past_a_float_s_precision_is_a_whole_number() -> None:
    # was: 10**20 layers "is not a whole number" (float(10**20 + 1) != 10**20 + 1); its size is for the memory
    # check to refuse, naming the GPU
    assert model_config_from_hf({**LLAMA, "num_hidden_layers": 10**20 + 1}, Path("m")).num_layers == 10**20 + 1


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xff\xfe\x00garbage\x80", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
], ids=["binary", "deep"])
def test_a_bare_config_json_given_as_model_that_cannot_be_read_is_refused(tmp_path: Path, data: bytes,
                                                                          needle: str) -> None:
    # was: --model path/to/config.json read by its own loader: UnicodeDecodeError and RecursionError tracebacks
    path = tmp_path / "my.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_model_config(str(path))
    assert err.value.field == "model" and str(path) in err.value.problem and needle in err.value.problem
    assert "\n" not in str(err.value) and err.value.fix
