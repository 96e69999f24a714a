"""`itlbench export-model`: a preset as a Hugging Face directory that transformers and the bundled
engine load to the same model, served by the bundled server with its tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.core.tokenizer import HFTokenizer
from itlbench.export.bpe_tokenizer import build_tokenizer
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.serving.build import create_engine
from itlbench.workloads.prompts import WORDS

torch.set_num_threads(1)

SEED = 3
TINY = PRESETS["tiny"]  # llama3 RoPE with original context 256: the 300-token prompt crosses it
PROMPT_LENS = (4, 40, 300)
NEW_TOKENS = 6
LOGIT_ATOL = 1e-4  # fp32 on both sides
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "tiny"
    result = runner.invoke(app, ["export-model", "tiny", str(out), "--seed", str(SEED)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(out)
    return out


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(3, TINY.vocab_size, n).tolist() for n in PROMPT_LENS]


def test_directory_is_transformers_5_layout(exported: Path) -> None:
    assert sorted(p.name for p in exported.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
    raw = json.loads((exported / "config.json").read_text())
    assert "rope_theta" not in raw and "rope_scaling" not in raw
    assert raw["rope_parameters"] == {"rope_type": "llama3", "rope_theta": TINY.rope_theta, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 256}
    assert raw["model_type"] == "llama" and raw["head_dim"] == TINY.head_dim


@pytest.mark.parametrize("budget", [None, 16])
def test_transformers_and_engine_agree_on_the_export(exported: Path, budget: int | None) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    disk = create_engine(EngineConfig(model=str(exported), chunk_budget=budget, kv_blocks=128, max_model_len=1024))
    preset = create_engine(EngineConfig(model="tiny", chunk_budget=budget, kv_blocks=128, max_model_len=1024, seed=SEED))
    first: dict[str, torch.Tensor] = {}
    sample = disk.runner.sampler

    def spy(rows: torch.Tensor, requests: list, *greedy: object) -> list[int]:
        for row, r in zip(rows, requests, strict=True):
            first.setdefault(r.request_id, row.clone())
        return sample(rows, requests, *greedy)

    disk.runner.sampler = spy  # type: ignore[assignment]
    reqs = [disk.add_request(p, GREEDY) for p in prompts()]
    while disk.has_unfinished():
        disk.step()
    assert [r.output_token_ids for r in reqs] == preset.generate(prompts(), GREEDY)
    with torch.no_grad():
        for p, req in zip(prompts(), reqs, strict=True):
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=0)
            assert out[0, len(p):].tolist() == req.output_token_ids, f"prompt {len(p)}"
            torch.testing.assert_close(first[req.request_id], model(ids).logits[0, -1], atol=LOGIT_ATOL, rtol=0)


def test_tokenizer_loads_alike_in_transformers_and_engine(exported: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(exported))
    ours = HFTokenizer(exported / "tokenizer.json", TINY.bos_token_id, TINY.eos_token_id)
    assert len(hf) == ours.vocab_size == TINY.vocab_size
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (TINY.bos_token_id, TINY.eos_token_id, 0)
    text = "Héllo, world ✓ — the river of data 42"
    ids = ours.encode(text)
    assert hf(text).input_ids == ids and ours.decode(ids) == text == hf.decode(ids)
    assert "assistant:" in hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                  add_generation_prompt=True)


def test_tokenizer_is_deterministic_and_prompt_words_are_single_tokens() -> None:
    a, b = build_tokenizer(2048, 1, 2), build_tokenizer(2048, 1, 2)
    assert a.to_str() == b.to_str() and a.get_vocab_size() == 2048
    assert all(len(a.encode(w).ids) == 1 for w in WORDS)
    top = build_tokenizer(600, 598, 599)  # Llama-3 style: specials at the top, pad at 0
    assert [top.token_to_id(t) for t in ("<|pad|>", "<|begin_of_text|>", "<|end_of_text|>")] == [0, 598, 599]
    assert top.get_vocab_size() == 600 and max(top.get_vocab().values()) == 599


def test_bundled_server_serves_the_export(exported: Path) -> None:
    engine = EngineConfig(model=str(exported), device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=1024)
    with BackgroundServer(ServerConfig(engine=engine, port=0)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        name = client.models.list().data[0].id
        text = " the river of data"
        r = client.completions.create(model=name, prompt=text, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
        tok = AutoTokenizer.from_pretrained(str(exported))
        assert r.usage.prompt_tokens == len(tok(text).input_ids) and r.usage.completion_tokens == 5
        ids = r.choices[0].model_extra["token_ids"]
        assert r.choices[0].text == tok.decode(ids)
        direct = create_engine(EngineConfig(model="tiny", kv_blocks=128, max_model_len=1024, seed=SEED))
        assert ids == direct.generate([tok(text).input_ids], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[0]


def test_export_refuses_a_non_empty_directory_and_unknown_presets(exported: Path, tmp_path: Path) -> None:
    busy = runner.invoke(app, ["export-model", "tiny", str(exported)], terminal_width=200)
    assert busy.exit_code == 2 and "error: OUT" in busy.output and "--force" in busy.output
    unknown = runner.invoke(app, ["export-model", "llama-9", str(tmp_path / "x")], terminal_width=200)
    assert unknown.exit_code == 2 and "error: PRESET" in unknown.output and not (tmp_path / "x").exists()


def test_export_refuses_what_this_machine_cannot_hold_before_drawing_a_weight(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A 405B preset is 1.6 TB of float32 weights, drawn in memory: refused in one line, nothing written."""
    big = runner.invoke(app, ["export-model", "llama-3.1-405b", str(tmp_path / "big")], terminal_width=300)
    assert big.exit_code == 2 and "error: PRESET: llama-3.1-405b has 1,623.4 GB of float32 weights" in big.output
    assert not (tmp_path / "big").exists()
    import shutil

    full = shutil._ntuple_diskusage(total=10**9, used=10**9, free=1000)  # type: ignore[attr-defined]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: full)
    for args, field in ((["tiny", str(tmp_path / "hf")], "OUT"),
                        (["tiny", str(tmp_path / "m.gguf"), "--format", "gguf"], "OUT")):
        r = runner.invoke(app, ["export-model", *args], terminal_width=300)
        assert r.exit_code == 2 and f"error: {field}: tiny's 607.5 kB of float32 weights do not fit the 1.0 kB" \
            in r.output, r.output
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.undo()
    r = runner.invoke(app, ["export-model", "tiny", str(blocker / "hf")], terminal_width=300)
    assert r.exit_code == 2 and "error: OUT: cannot create" in r.output and "Traceback" not in r.output


def test_an_out_ending_gguf_writes_a_gguf_file_and_says_its_size_as_a_reader_would(tmp_path: Path) -> None:
    """Without --format, `m.gguf` is the llama.cpp file the name asks for (not a directory of that name);
    a tiny preset's size is said in k and kB (as the refusals say it), not '0.2 M' and '1 MiB'."""
    out = tmp_path / "m.gguf"
    r = runner.invoke(app, ["export-model", "tiny", str(out)], terminal_width=300)
    assert r.exit_code == 0, r.output
    assert out.is_file() and out.read_bytes()[:4] == b"GGUF"
    params = TINY.num_params
    assert f"tiny: {params / 1e3:.3g} k parameters, " in r.output and " kB of float32 weights" in r.output
