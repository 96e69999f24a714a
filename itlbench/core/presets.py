"""Model presets and where a `--model` value points: a preset, a Hugging Face directory or a config.json."""

from __future__ import annotations

from pathlib import Path

from itlbench.core.hf_config import model_config_from_hf, read_hf_config
from itlbench.core.model_config import ModelConfig, RopeScaling
from itlbench.errors import ConfigError
from itlbench.json_file import read_json_object

_LLAMA31_ROPE = RopeScaling()

PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position_embeddings=131_072,
        rope_scaling=_LLAMA31_ROPE, bos_token_id=128_000, eos_token_id=128_001),
    "llama-3-8b": ModelConfig(
        name="llama-3-8b", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position_embeddings=8192,
        bos_token_id=128_000, eos_token_id=128_001),
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b", vocab_size=128_256, hidden_size=2048, intermediate_size=8192,
        num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=131_072,
        rope_scaling=RopeScaling(factor=32.0), tie_word_embeddings=True,
        bos_token_id=128_000, eos_token_id=128_001),
    # Shapes for the simulator's published comparisons (sim/published.py), from the models' config.json.
    "llama-2-7b": ModelConfig(
        name="llama-2-7b", vocab_size=32_000, hidden_size=4096, intermediate_size=11_008,
        num_layers=32, num_heads=32, num_kv_heads=32, max_position_embeddings=4096, rope_theta=10_000.0),
    "llama-2-70b": ModelConfig(
        name="llama-2-70b", vocab_size=32_000, hidden_size=8192, intermediate_size=28_672,
        num_layers=80, num_heads=64, num_kv_heads=8, max_position_embeddings=4096, rope_theta=10_000.0),
    "llama-3.3-70b": ModelConfig(
        name="llama-3.3-70b", vocab_size=128_256, hidden_size=8192, intermediate_size=28_672,
        num_layers=80, num_heads=64, num_kv_heads=8, max_position_embeddings=131_072,
        rope_scaling=_LLAMA31_ROPE, bos_token_id=128_000, eos_token_id=128_009),
    "llama-3.1-405b": ModelConfig(
        name="llama-3.1-405b", vocab_size=128_256, hidden_size=16_384, intermediate_size=53_248,
        num_layers=126, num_heads=128, num_kv_heads=8, max_position_embeddings=131_072,
        rope_scaling=_LLAMA31_ROPE, bos_token_id=128_000, eos_token_id=128_009),
    "yi-34b": ModelConfig(
        name="yi-34b", vocab_size=64_000, hidden_size=7168, intermediate_size=20_480,
        num_layers=60, num_heads=56, num_kv_heads=8, max_position_embeddings=200_000, rope_theta=5_000_000.0),
    # CPU presets: Llama-3 shapes scaled down so a 2-core box shows the phase fight in seconds.
    # cpu-small: 32-stream decode steps of ~10-20 ms and a 16k prefill of a few seconds on 2 cores;
    # narrow heads (4 x 32) keep the quadratic attention term of long prompts in check.
    "cpu-small": ModelConfig(
        name="cpu-small", vocab_size=8192, hidden_size=256, intermediate_size=768,
        num_layers=6, num_heads=4, num_kv_heads=1, head_dim=32, max_position_embeddings=65_536,
        rope_scaling=_LLAMA31_ROPE),
    "cpu-medium": ModelConfig(
        name="cpu-medium", vocab_size=8192, hidden_size=384, intermediate_size=1024,
        num_layers=4, num_heads=6, num_kv_heads=2, max_position_embeddings=65_536,
        rope_scaling=_LLAMA31_ROPE),
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, hidden_size=64, intermediate_size=160,
        num_layers=2, num_heads=4, num_kv_heads=2, max_position_embeddings=4096,
        rope_scaling=RopeScaling(factor=8.0, original_max_position_embeddings=256)),
}

CPU_DEFAULT_PRESET = "cpu-small"
CUDA_DEFAULT_PRESET = "llama-3.2-1b"
SIM_DEFAULT_PRESET = "llama-3.1-8b"  # the simulator prices a GPU: a toy model there answers nothing real
_BARE_CONFIG = 'give a transformers config.json object, like {"hidden_size": 2048, "num_hidden_layers": 16, ...}'


def default_preset(cuda: bool, sim: bool = False) -> str:
    """The preset a run uses when none is named: a real-size model where a GPU is, real or simulated (an
    8M-parameter toy on a simulated H100 prefilled 32k tokens in 13 ms), a CPU-sized one elsewhere (the
    caller asks torch whether CUDA is there: the core imports no torch)."""
    if sim:
        return SIM_DEFAULT_PRESET
    return CUDA_DEFAULT_PRESET if cuda else CPU_DEFAULT_PRESET


def load_model_config(spec: str) -> ModelConfig:
    """A preset name, a local Hugging Face directory holding `config.json`, or such a JSON file."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec).expanduser()
    if path.is_dir():
        return model_config_from_hf_dir(path)
    if path.is_file() and path.suffix == ".json":
        return _model_config_from_json_file(path)
    raise ConfigError("model", f"unknown preset or directory {spec!r}",
                      f"use one of {', '.join(PRESETS)} or a local Hugging Face model directory")


def model_config_from_hf_dir(path: Path) -> ModelConfig:
    """Read a Llama `config.json` in either layout transformers writes (see `hf_config`)."""
    return read_hf_config(path)


def _model_config_from_json_file(path: Path) -> ModelConfig:
    """A bare `config.json` (shapes only, e.g. for `itlbench roofline`)."""
    return model_config_from_hf(read_json_object(path, _BARE_CONFIG), path.parent)
