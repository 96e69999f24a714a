"""Mistral and Qwen config.json files from the command line: the simulator and roofline price them, the
bundled engine refuses them in one line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from itlbench.cli import app

# huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json, as published
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
             "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
             "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
             "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
             "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064}
# huggingface.co/Qwen/Qwen3-8B/blob/main/config.json, as published
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
            "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
            "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "use_sliding_window": False, "vocab_size": 151936}
# huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json: every layer attends over the last 4096 tokens
MISTRAL_7B_V01 = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
                  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
                  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                  "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
                  "vocab_size": 32000}
# no report: nothing here reads it, and drawing it was most of a simulated run's second
FAST = ["--workload", "fixed:512:16", "--streams", "2", "--warmup", "0s", "--duration", "1s", "--no-live",
        "--no-report"]


def _model_dir(tmp_path: Path, name: str, config: dict) -> Path:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(config))
    return tmp_path / name


def _one_error_line(output: str, starts: str) -> None:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {starts}"), output


def test_a_qwen2_directory_runs_on_the_simulator_and_is_refused_by_the_bundled_engine(tmp_path: Path) -> None:
    model = str(_model_dir(tmp_path, "Qwen2.5-7B", QWEN25_7B))
    sim = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", model, "--gpu", "h100", *FAST,
                                   "--out", str(tmp_path / "sim")], terminal_width=200)
    assert sim.exit_code == 0, sim.output
    assert "TTFT by prompt bucket" in sim.output and "Inter-token latency" in sim.output
    assert json.loads((tmp_path / "sim" / "run.json").read_text())["engine"]["model"]["family"] == "qwen2"
    real = CliRunner().invoke(app, ["run", "--engine", "torch", "--device", "cpu", "--model", model, *FAST,
                                    "--out", str(tmp_path / "real")], terminal_width=200)
    assert real.exit_code == 2, real.output
    _one_error_line(real.output, "config.json model_type: 'qwen2'")
    assert "--engine sim" in real.output and "roofline" in real.output and not (tmp_path / "real").exists()
    served = CliRunner().invoke(app, ["serve", "--model", model, "--device", "cpu"], terminal_width=200)
    assert served.exit_code == 2, served.output
    _one_error_line(served.output, "config.json model_type: 'qwen2'")


def test_roofline_prices_a_qwen3_config_json(tmp_path: Path) -> None:
    config = _model_dir(tmp_path, "Qwen3-8B", QWEN3_8B) / "config.json"
    result = CliRunner().invoke(app, ["roofline", "--model", str(config), "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["model"]["family"] == "qwen3" and doc["model"]["head_dim"] == 128
    assert doc["model"]["params"] == 8_190_735_360  # transformers' count of Qwen3-8B (tests/core/test_hf_config.py)
    assert doc["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2


def test_a_sliding_window_shorter_than_the_context_is_refused_in_one_line(tmp_path: Path) -> None:
    model = str(_model_dir(tmp_path, "Mistral-7B-v0.1", MISTRAL_7B_V01))
    refused = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", model, "--gpu", "h100", *FAST,
                                       "--out", str(tmp_path / "no")], terminal_width=200)
    assert refused.exit_code == 2, refused.output
    _one_error_line(refused.output, "config.json sliding_window: 4096")
    assert "--max-model-len 4096 or less" in refused.output
    windowed = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", model, "--gpu", "h100", "--max-model-len",
                                        "4096", *FAST, "--out", str(tmp_path / "ok")], terminal_width=200)
    assert windowed.exit_code == 0, windowed.output
    roofline = CliRunner().invoke(app, ["roofline", "--model", model, "--gpu", "h100"], terminal_width=200)
    assert roofline.exit_code == 2
    _one_error_line(roofline.output, "config.json sliding_window: 4096")


# huggingface.co/Qwen/Qwen2.5-7B-Instruct's model card: add this rope_scaling for prompts past 32,768 tokens
YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
# an FP8 checkpoint's config.json carries how it was quantized (compressed-tensors, as vLLM reads it)
FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
       "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}


def test_keys_that_change_only_the_engines_math_are_priced_by_the_simulator_and_refused_by_the_engine(
        tmp_path: Path) -> None:
    """A YaRN RoPE or a quantized checkpoint changes what the bundled engine computes, not a step's shapes."""
    yarn = str(_model_dir(tmp_path, "Qwen2.5-7B-Instruct", {**QWEN25_7B, "rope_scaling": YARN}))
    sim = CliRunner().invoke(app, ["run", "--engine", "sim", "--model", yarn, "--gpu", "h100", *FAST,
                                   "--out", str(tmp_path / "sim")], terminal_width=200)
    assert sim.exit_code == 0, sim.output
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
             "max_position_embeddings": 131072, "rope_theta": 500000.0, "quantization_config": FP8}
    fp8 = str(_model_dir(tmp_path, "Llama-3.1-70B-FP8", llama))
    roof = CliRunner().invoke(app, ["roofline", "--model", fp8, "--gpu", "h100", "--tp", "2", "--dtype", "fp8", "--json"])
    assert roof.exit_code == 0, roof.output
    assert json.loads(roof.output)["model"]["layers"] == 80
    real = CliRunner().invoke(app, ["run", "--engine", "torch", "--device", "cpu", "--model", fp8, *FAST,
                                    "--out", str(tmp_path / "real")], terminal_width=200)
    assert real.exit_code == 2, real.output
    _one_error_line(real.output, "config.json quantization_config: quantized checkpoints are not implemented")
    assert "--engine sim --dtype fp8" in " ".join(real.output.split()) and not (tmp_path / "real").exists()
