"""Hugging Face `config.json`: read either layout transformers writes, write the current one (Llama only).

transformers 5 keeps RoPE settings in `rope_parameters` (with `rope_theta` inside it); older files
carry top-level `rope_theta` and `rope_scaling`. Both are read with transformers' precedence and
defaults. A key that would change the model's math and that the engine does not implement is
refused with an error naming it: serving a model slightly wrong is worse than not serving it.

Besides Llama, the dense decoders of the same shape are read (Mistral, Qwen2/2.5, Qwen3: `FAMILIES`) for
what prices shapes only (the simulator, roofline); the bundled engine refuses them (`require_engine_family`).
Mixture-of-experts models are refused everywhere: the cost model prices dense layers only.

Torch-free, like the rest of the configuration.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from itlbench.core.model_config import FAMILIES, ModelConfig, RopeScaling
from itlbench.errors import ConfigError
from itlbench.json_file import read_json_object

# transformers' LlamaConfig defaults, used where config.json leaves a key out.
DEFAULT_THETA = 10_000.0
DEFAULT_RMS_NORM_EPS = 1e-6
ROPE_TYPES = ("default", "linear", "llama3")
ACTIVATIONS = ("silu", "swish")  # the same function under two names
ARCHITECTURES = ("LlamaForCausalLM",)
_ENGINE = "the bundled engine"
# each family's causal-LM class, and transformers' defaults where config.json leaves a key out
FAMILY_ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                       "qwen3": "Qwen3ForCausalLM"}
DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 131_072, "qwen2": 32_768, "qwen3": 32_768}
DEFAULT_HEAD_DIM = {"qwen3": 128}  # Qwen3Config's, whatever hidden_size / num_attention_heads is
DEFAULT_MAX_WINDOW_LAYERS = 28  # Qwen2Config's and Qwen3Config's: layers from this index on slide
# model_types (and keys) of mixture-of-experts models, whose MLP the dense cost model would misprice
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe", "phimoe",
             "granitemoe", "jamba", "minimax", "llama4", "gpt_oss")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
SHAPE_ONLY = "--engine sim and `itlbench roofline` accept mistral, qwen2 and qwen3 shapes"
_REPAIR = "re-download config.json from the model's repository, or point --model at a preset"


def read_hf_config(path: Path) -> ModelConfig:
    """The ModelConfig of a local Hugging Face model directory."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError("model", f"{path} has no config.json",
                          "point --model at a Hugging Face model directory or use a preset")
    return model_config_from_hf(read_json_object(cfg_file, _REPAIR), path)


def _key(name: str) -> str:
    return f"config.json {name}"


def _refuse(name: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(_key(name), problem, fix)


def model_config_from_hf(raw: dict[str, Any], path: Path) -> ModelConfig:
    """Map transformers' LlamaConfig keys (and its Mistral, Qwen2 and Qwen3 configs') to ModelConfig,
    refusing what the engine or the cost model would get wrong."""
    _refuse_experts(raw)
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in raw]
    if missing:
        raise ConfigError("model", f"{path / 'config.json'} lacks {', '.join(missing)}",
                          "a Llama-architecture config.json is required")
    refusals: list[ConfigError] = []  # keys that change the math the bundled engine does, not a step's cost
    family = _check_architecture(raw, refusals)
    heads, hidden = _count(raw, "num_attention_heads"), _count(raw, "hidden_size")
    head_dim = None if raw.get("head_dim") is None else _count(raw, "head_dim")
    head_dim = DEFAULT_HEAD_DIM.get(family) if head_dim is None else head_dim
    if head_dim is None:
        if hidden % heads:
            raise _refuse("head_dim", f"is absent and hidden_size={hidden} is not a multiple of "
                          f"num_attention_heads={heads}", "give head_dim explicitly")
        head_dim = hidden // heads
    max_positions = (_whole(raw, "max_position_embeddings") if raw.get("max_position_embeddings")
                     else DEFAULT_MAX_POSITIONS[family])
    theta, scaling = _rope(raw, max_positions, refusals)
    kv_heads = None if raw.get("num_key_value_heads") is None else _whole(raw, "num_key_value_heads")
    return ModelConfig(
        name=raw.get("_name_or_path") or path.name,
        vocab_size=_whole(raw, "vocab_size"), hidden_size=hidden,
        intermediate_size=_whole(raw, "intermediate_size"), num_layers=_whole(raw, "num_hidden_layers"),
        num_heads=heads, num_kv_heads=heads if kv_heads is None else int(kv_heads),
        head_dim=int(head_dim), max_position_embeddings=max_positions,
        rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=_real(raw, "rms_norm_eps", DEFAULT_RMS_NORM_EPS, above=None),
        tie_word_embeddings=_flag(raw, "tie_word_embeddings"),
        bos_token_id=_token_id(raw, "bos_token_id", 1), eos_token_id=_token_id(raw, "eos_token_id", 2),
        extra_eos_token_ids=_more_eos_ids(raw),
        path=str(path), family=family, sliding_window=_window(raw, family),
        engine_refusal=_as_refusal(refusals))


def _as_refusal(refusals: list[ConfigError]) -> tuple[str, str, str] | None:
    """The first key the bundled engine would compute wrong, as (field, problem, fix); None when it computes all."""
    return None if not refusals else (refusals[0].field, refusals[0].problem, refusals[0].fix or "")


def _whole(raw: dict[str, Any], name: str, key: str | None = None) -> int:
    """A count (layers, heads, sizes) as a whole number: `int()` would silently turn 32.5 layers into 32. `key`
    names it where it is nested (rope_scaling.original_max_position_embeddings)."""
    value = raw[name]
    name = key or name
    try:
        whole = int(value)
        exact = not isinstance(value, bool) and (isinstance(value, int) or float(value) == whole)
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        raise _refuse(name, f"is {value!r}, not a whole number", f"give {name} as an integer")
    return whole


def _count(raw: dict[str, Any], name: str) -> int:
    """A size every other one is derived from (heads, hidden size, head_dim): whole and > 0, refused by its own key
    before a derived one (hidden_size / 0 heads) is blamed."""
    whole = _whole(raw, name)
    if whole <= 0:
        raise _refuse(name, f"is {whole}, not a positive whole number", f"give {name} > 0")
    return whole


def _real(raw: dict[str, Any], name: str, default: float, above: float | None = 0.0, key: str | None = None) -> float:
    """A finite number (`float('small')` was a traceback, NaN or inf a run that died writing run.json), > `above`
    (>= 0 when `above` is None, as an epsilon may be); `default` when the key is absent or null."""
    value = raw.get(name)
    if value is None:
        return default
    try:
        num = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        num = math.nan
    bound = ">= 0" if above is None else f"> {above:g}"
    if not math.isfinite(num) or (num < 0 if above is None else num <= above):
        key = key or name
        raise _refuse(key, f"is {value!r}, not a finite number {bound}", f"give {key} as a number {bound}")
    return num


def _flag(raw: dict[str, Any], name: str) -> bool:
    """A JSON true or false (null: false): bool("false") is True."""
    value = raw.get(name)
    if value is not None and not isinstance(value, bool):
        raise _refuse(name, f"is {value!r}, not true or false", f"give {name} as a JSON boolean")
    return bool(value)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _id(value: Any, name: str) -> int:
    """One token id: a whole number >= 0 (not a bool, whose int() is 0 or 1)."""
    try:
        exact = not isinstance(value, bool) and int(value) == float(value) and int(value) >= 0
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        raise _refuse(name, f"holds {value!r}, not a token id", f"give {name} as an integer id >= 0, or a list of them")
    return int(value)


def _token_id(raw: dict[str, Any], name: str, default: int) -> int:
    """An id, the first of a list of ids, or the default when null."""
    value = raw.get(name, default)
    if isinstance(value, list):
        value = value[0] if value else None
    return default if value is None else _id(value, name)


def _more_eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    """The EOS ids after the first when config.json lists several (instruct models end a turn on any)."""
    value = raw.get("eos_token_id")
    return tuple(_id(v, "eos_token_id") for v in value[1:]) if isinstance(value, list) else ()


def _refuse_experts(raw: dict[str, Any]) -> None:
    model_type = raw.get("model_type", "llama")
    key = next((k for k in EXPERT_KEYS if raw.get(k)), None)
    if key is None and model_type not in MOE_TYPES:
        return
    experts = f"{raw[key]} experts" if key else "experts"
    raise _refuse(key or "model_type", f"{model_type!r} is a mixture-of-experts model ({experts})",
                  "the cost model prices dense layers only: simulate a dense llama, mistral, qwen2 or qwen3")


def _check_architecture(raw: dict[str, Any], refusals: list[ConfigError]) -> str:
    """The family (model_type) of a config the simulator prices right; what the engine would compute wrong goes
    to `refusals` (an activation, a bias, a quantized checkpoint: none changes a step's shapes)."""
    model_type = raw.get("model_type", "llama")
    if model_type not in FAMILIES:
        raise _refuse("model_type", f"{model_type!r} is not a Llama-shaped dense decoder itlbench reads",
                      f"{_ENGINE} computes 'llama' (LlamaForCausalLM); {SHAPE_ONLY}")
    arch = FAMILY_ARCHITECTURE[model_type]
    archs = raw.get("architectures") or [arch]
    if not isinstance(archs, list):
        raise _refuse("architectures", f"is {archs!r}, not a list", f'give ["{arch}"]')
    if arch not in archs:
        raise _refuse("architectures", f"{archs} names no {arch}", f"a {model_type} config.json names {arch}")
    act = raw.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        refusals.append(_refuse("hidden_act", f"{act!r} is not implemented", f"{_ENGINE} implements SwiGLU (hidden_act 'silu')"))
    for name in ("attention_bias", "mlp_bias") if model_type != "qwen2" else ():  # Qwen2's fixed biases: qkv_bias
        if raw.get(name):
            refusals.append(_refuse(name, "is true; bias terms are not implemented",
                                    f"{_ENGINE} implements bias-free projections (as in every Llama release)"))
    if raw.get("quantization_config"):
        refusals.append(_refuse("quantization_config", "quantized checkpoints are not implemented",
                                "use unquantized safetensors (the simulator prices them: --engine sim --dtype fp8)"))
    if model_type == "llama" and raw.get("sliding_window"):
        raise _refuse("sliding_window", f"{raw['sliding_window']} is set; sliding-window attention is not "
                      "implemented", f"{_ENGINE} attends over the full context")
    return model_type


def _window(raw: dict[str, Any], family: str) -> int | None:
    """The sliding window when any layer slides, as transformers decides: Mistral's every layer; Qwen's layers
    from max_window_layers on, and only under use_sliding_window; `layer_types` where config.json lists them."""
    window = raw.get("sliding_window")
    if family == "llama" or window is None:
        return None
    if family != "mistral":
        layer_types = raw.get("layer_types")
        if isinstance(layer_types, list):
            slides = "sliding_attention" in layer_types
        else:
            first = (DEFAULT_MAX_WINDOW_LAYERS if raw.get("max_window_layers") is None
                     else _whole(raw, "max_window_layers"))
            slides = bool(raw.get("use_sliding_window")) and first < _whole(raw, "num_hidden_layers")
        if not slides:
            return None
    return _whole(raw, "sliding_window")


def require_engine_family(model: ModelConfig) -> None:
    """The bundled engine computes Llama only: refuse, naming config.json's key, a family or a key (a RoPE, a
    bias, a quantized checkpoint) it would compute wrong. The simulator and roofline read shapes and skip this."""
    if model.family != "llama":
        raise _refuse("model_type", f"{model.family!r} ({model.name}): {_ENGINE} computes Llama "
                      "(LlamaForCausalLM) only", SHAPE_ONLY)
    if model.engine_refusal is not None:
        raise ConfigError(*model.engine_refusal)


def _rope(raw: dict[str, Any], max_positions: int, refusals: list[ConfigError]) -> tuple[float, RopeScaling | None]:
    """(θ, scaling) from `rope_scaling` (older layout; transformers lets it win) or `rope_parameters`. A RoPE the
    engine does not implement goes to `refusals` with scaling None: positions change no step's cost."""
    source = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(source) or {}
    if not isinstance(params, dict):
        raise _refuse(source, f"must be an object, got {params!r}", "see transformers' LlamaConfig")
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    if nested:
        raise _refuse(source, f"holds per-layer-type settings ({', '.join(nested)})",
                      f"{_ENGINE} applies one RoPE to every layer")
    theta = (_real(params, "rope_theta", DEFAULT_THETA, key=f"{source}.rope_theta") if params.get("rope_theta")
             is not None else _real(raw, "rope_theta", DEFAULT_THETA))
    partial = (_real(params, "partial_rotary_factor", 1.0, key=f"{source}.partial_rotary_factor")
               if params.get("partial_rotary_factor") is not None else _real(raw, "partial_rotary_factor", 1.0))
    if partial != 1.0:
        refusals.append(_refuse(f"{source}.partial_rotary_factor", f"{partial} rotates only part of each head",
                                f"{_ENGINE} rotates whole heads (partial_rotary_factor 1.0)"))
        return theta, None
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        refusals.append(_refuse(f"{source}.rope_type", f"{rope_type!r} is not implemented",
                                f"{_ENGINE} implements {', '.join(ROPE_TYPES)}; serve this model with an engine "
                                f"that implements {rope_type}"))
        return theta, None
    if rope_type == "default":
        return theta, None
    missing = [n for n in ("factor", *(("low_freq_factor", "high_freq_factor") if rope_type == "llama3" else ()))
               if params.get(n) is None]
    if missing:
        refusals.append(_refuse(f"{source}.{missing[0]}", f"is required for rope_type {rope_type!r}",
                                "add it to config.json"))
        return theta, None
    factor = _real(params, "factor", 1.0, key=f"{source}.factor")
    if rope_type == "linear":
        return theta, RopeScaling(rope_type="linear", factor=factor)
    low, high = (_real(params, n, 1.0, key=f"{source}.{n}") for n in ("low_freq_factor", "high_freq_factor"))
    if high <= low:  # llama3's smoothing divides by high - low
        raise _refuse(f"{source}.high_freq_factor", f"{high:g} is not above low_freq_factor {low:g}",
                      "re-download config.json (Llama 3.1 has low_freq_factor 1, high_freq_factor 4)")
    # transformers lets a top-level original_max_position_embeddings win, else defaults to the model's.
    name = "original_max_position_embeddings"
    key = name if raw.get(name) is not None else f"{source}.{name}"
    original = (_whole(raw, name) if raw.get(name) is not None
                else _whole(params, name, key) if params.get(name) is not None else max_positions)
    if original <= 0:
        raise _refuse(key, f"is {original}, not a positive token count", f"give {name} > 0")
    return theta, RopeScaling(rope_type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                              original_max_position_embeddings=original)


def hf_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The model as a transformers 5 LlamaConfig (`rope_parameters` layout), loadable by transformers and vLLM."""
    if cfg.family != "llama":
        raise ConfigError("model.family", f"{cfg.name} is a {cfg.family} model; only Llama configs are written",
                          "export a Llama preset")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    s = cfg.rope_scaling
    if s is not None and s.rope_type == "linear":
        rope.update(rope_type="linear", factor=s.factor)
    elif s is not None:
        rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                    high_freq_factor=s.high_freq_factor,
                    original_max_position_embeddings=s.original_max_position_embeddings)
    return {
        "architectures": list(ARCHITECTURES), "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rope_parameters": rope,
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": [cfg.eos_token_id, *cfg.extra_eos_token_ids] if cfg.extra_eos_token_ids else cfg.eos_token_id,
        "pad_token_id": None,
        "initializer_range": 0.02, "use_cache": True, "dtype": "float32",
    }
