"""A preset as a Llama GGUF file, so llama.cpp serves the model the bundled engine serves.

Same shapes, same seeded dummy weights (`export_model._dummy_weights`) and the same byte-level BPE
tokenizer (`bpe_tokenizer.build_tokenizer`) as `itlbench export-model`, written with the `gguf`
package (llama.cpp's own writer, `pip install gguf`) in float32. What has to match llama.cpp's
Llama graph:

- Q and K rows are permuted per head from the Hugging Face layout (RoPE on the two halves of a
  head) to llama.cpp's (RoPE on adjacent pairs), as llama.cpp's Hugging Face converter does; V, O
  and the MLP are unchanged. Both layouts compute the same attention scores.
- An explicit head_dim (cpu-small: 4 heads of 32 on a 256-wide model) goes in as key/value
  length and RoPE dimension count.
- "llama3" RoPE scaling is a `rope_freqs` tensor of per-frequency divisors; "linear" is the
  scaling type and factor in the metadata.
- The tokenizer is "gpt2" (byte-level BPE with merges) with the GPT-2 pre-tokenizer split, the
  special tokens marked as control tokens, and neither BOS nor EOS added to prompts (as the
  exported tokenizer_config.json says).

    itlbench export-model --format gguf cpu-small ~/peers/models/cpu-small.gguf
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.errors import ConfigError


@dataclass(frozen=True)
class ExportedGGUF:
    path: Path
    model: ModelConfig
    seed: int
    tensor_bytes: int


def export_gguf(preset: str, out: Path, seed: int = 0, force: bool = False) -> ExportedGGUF:
    """Write `preset` with the dummy weights the bundled engine draws for `seed` to GGUF file `out`."""
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("gguf", "the gguf package is not installed", "pip install gguf") from exc
    if preset not in PRESETS:
        raise ConfigError("PRESET", f"unknown preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    cfg = PRESETS[preset]
    from itlbench.export.hf import CHAT_TEMPLATE, _dummy_weights, check_room, check_seed

    check_seed(seed)
    out = Path(out)
    if out.is_dir():
        raise ConfigError("OUT", f"{out} is a directory", "name the .gguf file to write")
    if out.exists() and not force:
        raise ConfigError("OUT", f"{out} exists", "choose a new file or pass --force")
    from itlbench.rundir.outdir import make_dir

    check_room(preset, cfg, out.parent, "OUT")
    make_dir(out.parent, "OUT")

    tensors = gguf_tensors(cfg, _dummy_weights(cfg, seed))
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"itlbench-{cfg.name}-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_scaling.factor)
    _add_tokenizer(writer, cfg, CHAT_TEMPLATE)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return ExportedGGUF(out, cfg, seed, sum(a.nbytes for a in tensors.values()))


def permute_rope_rows(w: Any, n_heads: int) -> Any:
    """Rows of a Q or K projection [n_heads * head_dim, in] from the half-split RoPE layout to the
    adjacent-pairs layout: within each head, output row 2i is row i and row 2i+1 is row i + D/2."""
    rows = w.shape[0]
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: ModelConfig) -> Any:
    """Per-frequency divisors [head_dim/2] that turn plain RoPE frequencies into "llama3"-scaled
    ones (the `rope_freqs` tensor llama.cpp divides each frequency by)."""
    import numpy as np

    from itlbench.engine.model.rope import inv_frequencies

    s = cfg.rope_scaling
    assert s is not None and s.rope_type == "llama3"
    base = inv_frequencies(cfg.head_dim, cfg.rope_theta, None).numpy()
    scaled = inv_frequencies(cfg.head_dim, cfg.rope_theta, s).numpy()
    factors = base / scaled
    # exact where the scaling leaves a frequency alone or divides it by `factor`
    factors[np.isclose(factors, 1.0, rtol=0, atol=1e-12)] = 1.0
    factors[np.isclose(factors, s.factor, rtol=1e-12, atol=0)] = s.factor
    if not np.all(np.isfinite(factors)) or math.isclose(float(factors.min()), 0.0):
        raise ConfigError("model.rope_scaling", "llama3 scaling gives invalid RoPE factors",
                          "give factor > 0 and 0 < low_freq_factor < high_freq_factor")
    return factors.astype(np.float32)


def gguf_tensors(cfg: ModelConfig, hf: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face-named torch tensors → llama.cpp-named float32 numpy arrays (numpy row-major
    shapes; the writer stores dimensions innermost first, as llama.cpp expects)."""
    import numpy as np

    def arr(t: Any) -> Any:
        return np.ascontiguousarray(t.detach().to("cpu").float().numpy(), dtype=np.float32)

    out: dict[str, Any] = {"token_embd.weight": arr(hf["model.embed_tokens.weight"])}
    for i in range(cfg.num_layers):
        pre, blk = f"model.layers.{i}.", f"blk.{i}."
        out[blk + "attn_norm.weight"] = arr(hf[pre + "input_layernorm.weight"])
        out[blk + "attn_q.weight"] = permute_rope_rows(arr(hf[pre + "self_attn.q_proj.weight"]), cfg.num_heads)
        out[blk + "attn_k.weight"] = permute_rope_rows(arr(hf[pre + "self_attn.k_proj.weight"]), cfg.num_kv_heads)
        out[blk + "attn_v.weight"] = arr(hf[pre + "self_attn.v_proj.weight"])
        out[blk + "attn_output.weight"] = arr(hf[pre + "self_attn.o_proj.weight"])
        out[blk + "ffn_norm.weight"] = arr(hf[pre + "post_attention_layernorm.weight"])
        out[blk + "ffn_gate.weight"] = arr(hf[pre + "mlp.gate_proj.weight"])
        out[blk + "ffn_up.weight"] = arr(hf[pre + "mlp.up_proj.weight"])
        out[blk + "ffn_down.weight"] = arr(hf[pre + "mlp.down_proj.weight"])
    out["output_norm.weight"] = arr(hf["model.norm.weight"])
    if "lm_head.weight" in hf:  # tied embeddings: llama.cpp reuses token_embd when output is absent
        out["output.weight"] = arr(hf["lm_head.weight"])
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "llama3":
        out["rope_freqs.weight"] = llama3_rope_factors(cfg)
    for name, a in out.items():
        out[name] = np.ascontiguousarray(a)
    return out


def _add_tokenizer(writer: Any, cfg: ModelConfig, chat_template: str) -> None:
    import gguf

    from itlbench.export.bpe_tokenizer import PAD, build_tokenizer

    tok = build_tokenizer(cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id)
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    if sorted(by_id) != list(range(cfg.vocab_size)):
        raise ConfigError("model.vocab_size", f"the tokenizer does not fill ids 0..{cfg.vocab_size - 1}",
                          "an exporter bug: please report it with the preset's name")
    specials = {int(i) for i, added in tok.get_added_tokens_decoder().items() if added.special}
    tokens = [by_id[i] for i in range(cfg.vocab_size)]
    types = [gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(cfg.vocab_size)]
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    pad = vocab.get(PAD)
    if pad is not None:
        writer.add_pad_token_id(pad)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)
