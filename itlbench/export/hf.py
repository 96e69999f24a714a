"""A preset as a Hugging Face model directory, so the same model runs in the bundled engine,
transformers and external engines such as vLLM.

The directory holds config.json in transformers 5's layout (`rope_parameters`), the bundled engine's
seeded dummy weights under Hugging Face tensor names (model.safetensors, float32), and a byte-level
BPE tokenizer of the preset's vocabulary size (tokenizer.json and tokenizer_config.json). The
bundled engine serving the directory computes exactly what it computes for the preset with the same
seed; an external engine loading the weights computes the same model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from itlbench.core.hf_config import hf_config_dict
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.errors import ConfigError
from itlbench.rundir.outdir import make_dir

# A plain template so chat endpoints work: "role: content" lines, then the assistant's turn.
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Exported:
    path: Path
    model: ModelConfig
    seed: int
    weight_bytes: int


def export_model(preset: str, out: Path, seed: int = 0, force: bool = False) -> Exported:
    """Write `preset` with the dummy weights the bundled engine draws for `seed` into directory `out`."""
    if preset not in PRESETS:
        raise ConfigError("PRESET", f"unknown preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    cfg = PRESETS[preset]
    check_seed(seed)
    if out.exists() and not out.is_dir():
        raise ConfigError("OUT", f"{out} exists and is not a directory", "choose a new directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError("OUT", f"{out} exists and is not empty", "choose a new directory or pass --force")
    check_room(preset, cfg, out, "OUT")
    make_dir(out, "OUT")
    tensors = _dummy_weights(cfg, seed)
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", hf_config_dict(cfg))
    _write_json(out / "generation_config.json",
                {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False})
    _write_tokenizer(out, cfg)
    return Exported(out, cfg, seed, sum(t.numel() * t.element_size() for t in tensors.values()))


def check_seed(seed: int) -> None:
    """The bundled engine's seeds, 0 to 2**64 - 1 (`itlbench run --seed`; torch takes none past it)."""
    if not 0 <= seed <= 2**64 - 1:
        raise ConfigError("--seed", f"must be a whole number from 0 to 2**64 - 1, got {seed}", "e.g. --seed 0")


def check_room(preset: str, cfg: ModelConfig, out: Path, field: str) -> None:
    """Refuse, before drawing a single weight, a preset whose float32 weights do not fit this machine's free
    memory (they are drawn in memory) or the disk under `out` (a 405B preset is 1.6 TB)."""
    import shutil

    import psutil

    need = cfg.num_params * 4
    if need > (memory := psutil.virtual_memory().available):
        raise ConfigError("PRESET", f"{preset} has {size_text(need)} of float32 weights, more than this machine's "
                          f"{size_text(memory)} of free memory", "export a smaller preset (tiny, cpu-small, cpu-medium, "
                          "llama-3.2-1b)")
    disk_at = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if need > (disk := shutil.disk_usage(disk_at).free):
        raise ConfigError(field, f"{preset}'s {size_text(need)} of float32 weights do not fit the {size_text(disk)} "
                          f"free under {disk_at}", "write it where there is room")


def size_text(n: float) -> str:
    """Bytes as the refusals and the export line say them (decimal units: 607.5 kB)."""
    for unit, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= unit:
            return f"{n / unit:,.1f} {name}"
    return f"{n:,.0f} B"


def _dummy_weights(cfg: ModelConfig, seed: int) -> dict[str, Any]:
    from itlbench.engine.model.llama import LlamaForCausalLM
    from itlbench.engine.model.loader import hf_state_dict, init_dummy_weights

    model = LlamaForCausalLM(cfg)
    init_dummy_weights(model, seed)
    return hf_state_dict(model)


def _write_tokenizer(out: Path, cfg: ModelConfig) -> None:
    from itlbench.export.bpe_tokenizer import BOS, EOS, PAD, build_tokenizer

    tok = build_tokenizer(cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id)
    tok.save(str(out / "tokenizer.json"))
    pad = PAD if tok.token_to_id(PAD) is not None else None
    _write_json(out / "tokenizer_config.json", {
        # Load tokenizer.json as it is, not through a model-specific tokenizer class.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": pad, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_position_embeddings, "chat_template": CHAT_TEMPLATE,
    })


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
