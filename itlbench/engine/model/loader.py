"""Weights: seeded dummy init by default, or Hugging Face Llama safetensors from a local directory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from itlbench.core.model_config import ModelConfig
from itlbench.engine.model.llama import LlamaForCausalLM
from itlbench.errors import ConfigError


@torch.no_grad()
def init_dummy_weights(model: LlamaForCausalLM, seed: int = 0) -> None:
    """Uniform(±1/sqrt(fan_in)) matrices and unit norms: same seed → same weights on any device.

    Large enough that attention and every layer shape the output (greedy decoding is not a tie
    between near-equal logits), small enough that activations stay O(1).
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        bound = p.shape[1] ** -0.5
        w = torch.empty(p.shape, dtype=torch.float32).uniform_(-bound, bound, generator=gen)
        p.copy_(w)


def _hf_layer_names(i: int) -> dict[str, str]:
    pre = f"model.layers.{i}."
    return {k: pre + k + ".weight" for k in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}


def hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face Llama names (fused projections split back)."""
    cfg = model.config
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        n = _hf_layer_names(i)
        q, k, v = layer.self_attn.qkv_proj.split([q_rows, kv_rows, kv_rows])
        gate, up = layer.mlp.gate_up_proj.chunk(2)
        out.update({
            n["self_attn.q_proj"]: q, n["self_attn.k_proj"]: k, n["self_attn.v_proj"]: v,
            n["self_attn.o_proj"]: layer.self_attn.o_proj, n["mlp.gate_proj"]: gate, n["mlp.up_proj"]: up,
            n["mlp.down_proj"]: layer.mlp.down_proj, n["input_layernorm"]: layer.input_layernorm.weight,
            n["post_attention_layernorm"]: layer.post_attention_layernorm.weight})
    return {k: v.detach().contiguous() for k, v in out.items()}


@torch.no_grad()
def load_hf_state_dict(model: LlamaForCausalLM, tensors: Mapping[str, torch.Tensor], source: str = "weights") -> None:
    """Copy Hugging Face-named tensors into the model, checking every name and shape first."""
    expected = hf_state_dict(model)
    missing = [k for k in expected if k not in tensors]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ConfigError("model", f"{source} lacks tensors {shown}",
                          "the checkpoint must be a Llama-architecture model matching config.json")
    for name, ref in expected.items():
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise ConfigError("model", f"{source}: {name} has shape {tuple(tensors[name].shape)}, "
                              f"config.json implies {tuple(ref.shape)}", "config.json and weights disagree")
    cfg = model.config
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    model.embed_tokens.copy_(tensors["model.embed_tokens.weight"])
    model.norm.weight.copy_(tensors["model.norm.weight"])
    if model.lm_head is not None:
        model.lm_head.copy_(tensors["lm_head.weight"])
    for i, layer in enumerate(model.layers):
        n = _hf_layer_names(i)
        qkv = layer.self_attn.qkv_proj
        qkv[:q_rows].copy_(tensors[n["self_attn.q_proj"]])
        qkv[q_rows:q_rows + kv_rows].copy_(tensors[n["self_attn.k_proj"]])
        qkv[q_rows + kv_rows:].copy_(tensors[n["self_attn.v_proj"]])
        layer.self_attn.o_proj.copy_(tensors[n["self_attn.o_proj"]])
        f = cfg.intermediate_size
        layer.mlp.gate_up_proj[:f].copy_(tensors[n["mlp.gate_proj"]])
        layer.mlp.gate_up_proj[f:].copy_(tensors[n["mlp.up_proj"]])
        layer.mlp.down_proj.copy_(tensors[n["mlp.down_proj"]])
        layer.input_layernorm.weight.copy_(tensors[n["input_layernorm"]])
        layer.post_attention_layernorm.weight.copy_(tensors[n["post_attention_layernorm"]])


def safetensors_files(path: Path) -> list[Path]:
    """The shards named by model.safetensors.index.json, or every *.safetensors in the directory."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        fix = f"re-download {index.name} from the model's repository"
        try:
            raw = json.loads(index.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError("model", f"{index} is not valid JSON: {exc}", fix) from exc
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict):
            raise ConfigError("model", f"{index} holds no weight_map object", fix)
        files = [path / str(n) for n in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ConfigError("model", f"{path} lacks shards {', '.join(absent)} named by {index.name}",
                              f"re-download the shards listed in {index.name}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError("model", f"{path} has no *.safetensors weights",
                          "download the checkpoint's safetensors files or use a preset for dummy weights")
    return files


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in safetensors_files(path):
        tensors.update(load_file(str(f)))
    return tensors


def load_weights(model: LlamaForCausalLM, cfg: ModelConfig, seed: int = 0) -> None:
    """Checkpoint weights when the config came from a directory, seeded dummy weights otherwise."""
    if cfg.path is None:
        init_dummy_weights(model, seed)
        return
    path = Path(cfg.path)
    load_hf_state_dict(model, read_safetensors_dir(path), source=str(path))
