"""Bad input names its fix: a broken JSON file or an out-of-range value says what to pass or how to repair it,
and the command line prints it as one line, exit 2, no traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.hf_config import model_config_from_hf, read_hf_config
from itlbench.core.presets import load_model_config
from itlbench.core.tokenizer import ByteTokenizer
from itlbench.errors import ConfigError
from itlbench.sim.hardware import load_hardware
from itlbench.sim.profile import Hardware

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
PROFILE = {"name": "x", "peak_flops": 1e15, "mem_bw": 1e12, "memory_bytes": 8e10}
ENGINE_JSON_FIX = 'write a JSON object of engine flags, _ for -, like {"max_num_seqs": 64, "chunk_budget": 2048}'


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


CASES: list[tuple[str, Callable[[Path], object], str, str]] = [
    ("engine-config-bad-json", lambda _: EngineConfig.from_json("{bad"), "--engine-config", ENGINE_JSON_FIX),
    ("engine-config-list", lambda _: EngineConfig.from_json("[1]"), "--engine-config", ENGINE_JSON_FIX),
    ("config-json-broken", lambda p: read_hf_config(_file(p, "m/config.json", "{bad").parent), "model",
     "re-download config.json from the model's repository, or point --model at a preset"),
    ("bare-config-list", lambda p: load_model_config(str(_file(p, "shape.json", "[1]"))), "model",
     'give a transformers config.json object, like {"hidden_size": 2048, "num_hidden_layers": 16, ...}'),
    ("zero-layers", lambda p: model_config_from_hf({**LLAMA, "num_hidden_layers": 0}, p), "model.num_layers",
     "set num_hidden_layers > 0 in the model's config.json"),
    ("odd-head-dim", lambda p: model_config_from_hf({**LLAMA, "head_dim": 15}, p), "model.head_dim",
     "set an even head_dim in the model's config.json"),
    ("profile-zero", lambda p: load_hardware(str(_file(p, "gpu.json", json.dumps({**PROFILE, "peak_flops": 0})))), "--gpu",
     "e.g. 9.89e+14, the h100 preset's"),
    ("profile-lacks", lambda _: Hardware.from_dict({"name": "x", "peak_flops": 1e15}, "gpu.json"), "--gpu",
     'add them as an H100\'s would read: "mem_bw": 3.35e12, "memory_bytes": 8.0e10'),
    ("token-id", lambda _: Engine._validate(SimpleNamespace(model_config=SimpleNamespace(vocab_size=10)),  # type: ignore[arg-type]
                                            [3, 12], None), "prompt", "send token ids below 10"),
    ("byte-vocab", lambda _: ByteTokenizer(3), "model.vocab_size", "set vocab_size to at least 259, an id per byte, in the model's config.json"),
    ("kv-blocks", lambda _: EngineConfig(kv_blocks=0), "kv_blocks",
     "e.g. --kv-blocks 4096, or leave it out to size the cache from --kv-memory-gib"),
]


@pytest.mark.parametrize(("make", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_names_its_fix(tmp_path: Path, make: Callable[[Path], object], field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make(tmp_path)
    assert caught.value.field == field and caught.value.fix == fix
    assert str(caught.value).endswith(f" ({fix})") and "\n" not in str(caught.value)


def test_missing_shard_names_the_index_to_download_from(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from itlbench.engine.model.loader import safetensors_files

    _file(tmp_path, "model.safetensors.index.json", json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ConfigError, match=r"lacks shards model-00001-of-00002\.safetensors") as caught:
        safetensors_files(tmp_path)
    assert caught.value.fix == "re-download the shards listed in model.safetensors.index.json"
    _file(tmp_path, "model.safetensors.index.json", "[]")  # once a TypeError's traceback
    with pytest.raises(ConfigError, match="holds no weight_map object") as caught:
        safetensors_files(tmp_path)
    assert caught.value.fix == "re-download model.safetensors.index.json from the model's repository"


@pytest.mark.parametrize(("args", "line"), [  # DIR: a model directory with a broken config.json; GPU: a bad profile
    (["serve", "--engine-config", "{bad"], f"({ENGINE_JSON_FIX})"),
    (["serve", "--max-body-mib", "0"], "error: --max-body-mib: must be > 0, got 0.0"),
    # a context shorter than one block: once blamed on --block-size 16, with "--block-size 16" as the fix
    (["serve", "--engine", "sim", "--max-model-len", "8"], "error: --max-model-len: 8 tokens is less than one K/V "
     "block of 16 (--block-size) (use --max-model-len 16 or more, or a smaller --block-size)"),
    (["run", "--max-model-len", "64", "--block-size", "128"], "error: --max-model-len: 64 tokens is less than one "
     "K/V block of 128 (--block-size) (use --max-model-len 128 or more, or a smaller --block-size)"),
    (["roofline", "--model", "DIR"], "(re-download config.json from the model's repository, or point --model at a preset)"),
    (["roofline", "--gpu", "GPU"], "peak_flops must be a positive number, got 0 (e.g. 9.89e+14, the h100 preset's)"),
])
def test_cli_prints_one_line_with_the_fix(tmp_path: Path, args: list[str], line: str) -> None:
    model_dir = _file(tmp_path, "m/config.json", "{bad").parent
    gpu = _file(tmp_path, "gpu.json", json.dumps({**PROFILE, "peak_flops": 0}))
    result = CliRunner().invoke(app, [{"DIR": str(model_dir), "GPU": str(gpu)}.get(a, a) for a in args])
    out = result.output.strip()
    assert result.exit_code == 2 and out.count("\n") == 0 and "Traceback" not in out, out
    assert out.startswith("error: ") and line in out
