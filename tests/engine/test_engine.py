"""Engine facade: step records, stop rules, aborts, sampling, input validation, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.model_config import ModelConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import Request, SamplingParams
from itlbench.core.scheduler_output import ScheduledChunk, SchedulerOutput
from itlbench.core.tokenizer import ByteTokenizer, HFTokenizer
from itlbench.engine.batch import flatten
from itlbench.engine.model.loader import hf_state_dict
from itlbench.engine.runner import HUGE_PAGE, _zeros, num_kv_blocks
from itlbench.engine.sampler import Sampler
from itlbench.errors import ConfigError
from itlbench.serving.build import create_engine

torch.set_num_threads(1)

TINY = PRESETS["tiny"]
FORCED = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def make_engine(**kw: object) -> Engine:
    base = dict(model="tiny", kv_blocks=256, block_size=16, max_model_len=1024)
    base.update(kw)
    return create_engine(EngineConfig(**base))  # type: ignore[arg-type]


def run(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()


def tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, TINY.vocab_size, n).tolist()


# ----------------------------------------------------------------- flattening


def test_flatten_matches_worked_example() -> None:
    """Three requests scheduled for 2, 5 and 3 tokens → query_start_loc [0, 2, 7, 10]."""
    a = Request("a", list(range(10, 30)), FORCED, num_computed_tokens=18, block_ids=[4, 9])
    b = Request("b", list(range(40, 45)), FORCED, block_ids=[1])
    c = Request("c", list(range(50, 60)), FORCED, num_computed_tokens=3, block_ids=[7])
    out = SchedulerOutput([ScheduledChunk(a, 18, 2, False), ScheduledChunk(b, 0, 5, False),
                           ScheduledChunk(c, 3, 3, False)])
    batch = flatten(out, block_size=16)
    assert batch.query_start_loc.tolist() == [0, 2, 7, 10]
    assert batch.seq_lens.tolist() == [20, 5, 6]
    assert batch.positions.tolist() == [18, 19, 0, 1, 2, 3, 4, 3, 4, 5]
    assert batch.input_ids.tolist() == [28, 29, 40, 41, 42, 43, 44, 53, 54, 55]
    assert batch.slot_mapping.tolist() == [9 * 16 + 2, 9 * 16 + 3, 16, 17, 18, 19, 20, 115, 116, 117]
    assert batch.block_tables.tolist() == [[4, 9], [1, 0], [7, 0]]
    assert batch.logits_indices.tolist() == [1, 6]  # c stops mid-prompt and does not sample
    assert [r.request_id for r in batch.sample_requests] == ["a", "b"]


# ----------------------------------------------------------------- step records


def test_step_records_prefill_then_decode() -> None:
    engine = make_engine(chunk_budget=2048)
    engine.add_request(tokens(30), FORCED, request_id="x")
    engine.add_request(tokens(20, 1), FORCED, request_id="y")
    run(engine)
    recs = engine.step_log.since(0)
    assert [r.step for r in recs] == list(range(len(recs)))
    first = recs[0]
    assert (first.phase, first.prefill_tokens, first.decode_tokens) == ("prefill", 50, 0)
    assert first.prefill_request_ids == ("x", "y") and first.num_prefill_reqs == 2
    assert first.token_budget == 2048 and first.kv_usage > 0
    assert [(r.phase, r.decode_tokens, r.num_decode_reqs) for r in recs[1:]] == [("decode", 2, 2)] * 3
    assert recs[-1].num_finished == 2 and recs[-1].num_running == 0
    assert all(r.end_ns >= r.start_ns and r.wall_start_ns > 0 for r in recs)


def test_budget_policy_mixes_and_chunks() -> None:
    engine = make_engine(chunk_budget=16)
    engine.add_request(tokens(8), SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), request_id="d")
    engine.step()
    engine.step()
    engine.add_request(tokens(40, 2), FORCED, request_id="p")
    recs = []
    while engine.has_unfinished():
        engine.step()
        recs.append(engine.step_log.since(engine.step_log.last_step)[0])
    mixed = [r for r in recs if r.phase == "mixed"]
    assert [(r.prefill_tokens, r.decode_tokens) for r in mixed] == [(15, 1), (15, 1), (10, 1)]
    assert all(r.prefill_request_ids == ("p",) for r in mixed)
    assert all(r.scheduled_tokens <= 16 for r in recs)


def test_prefill_first_never_mixes_unless_asked() -> None:
    for mixed in (False, True):
        engine = make_engine(chunk_budget=16, policy="prefill-first", mixed=mixed)
        engine.add_request(tokens(8), SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
        engine.step()
        engine.step()
        engine.add_request(tokens(40, 2), FORCED)
        run(engine)
        phases = {r.phase for r in engine.step_log.since(0)}
        assert ("mixed" in phases) is mixed


def test_idle_step_records_nothing() -> None:
    engine = make_engine()
    assert engine.step() == []
    assert engine.step_log.last_step == -1


# ----------------------------------------------------------------- outputs and stop rules


def test_outputs_and_timestamps() -> None:
    engine = make_engine()
    req = engine.add_request(tokens(12), FORCED)
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    assert [o.new_token_ids[0] for o in outs] == req.output_token_ids
    assert [o.num_output_tokens for o in outs] == [1, 2, 3, 4]
    assert [o.finished for o in outs] == [False, False, False, True]
    assert outs[-1].finish_reason == "length" and outs[-1].num_prompt_tokens == 12
    assert req.arrival_ns <= req.first_scheduled_ns <= req.first_token_ns <= req.finished_ns
    assert outs[0].time_ns == req.first_token_ns


def test_forced_lengths_exact() -> None:
    engine = make_engine()
    eos = engine.model_config.eos_token_id
    every = tuple(range(TINY.vocab_size))
    ignore = engine.add_request(tokens(9), SamplingParams(max_tokens=7, temperature=1.0, ignore_eos=True,
                                                          stop_token_ids=()))
    minimum = engine.add_request(tokens(9), SamplingParams(max_tokens=10, min_tokens=3, temperature=0,
                                                           stop_token_ids=every))
    stop_now = engine.add_request(tokens(9), SamplingParams(max_tokens=10, temperature=0, stop_token_ids=every))
    run(engine)
    assert ignore.num_output_tokens == 7 and ignore.finish_reason == "length"
    assert minimum.num_output_tokens == 3 and minimum.finish_reason == "stop"
    assert stop_now.num_output_tokens == 1 and stop_now.finish_reason == "stop"
    assert eos == 2


def test_abort_frees_every_block() -> None:
    engine = make_engine(chunk_budget=64)
    sp = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    reqs = [engine.add_request(tokens(40, i), sp) for i in range(3)]
    for _ in range(6):
        engine.step()
    assert engine.block_manager.usage > 0 and engine.num_running == 3
    assert all(engine.abort(r.request_id) for r in reqs)
    assert engine.block_manager.usage == 0.0
    assert not engine.has_unfinished() and engine.step() == []
    assert all(r.finish_reason == "abort" and r.finished_ns for r in reqs)
    assert engine.abort("nope") is False
    engine.block_manager.check_invariants()
    waiting = engine.add_request(tokens(5), FORCED)  # aborting a waiting request works too
    assert engine.abort(waiting.request_id) and engine.num_waiting == 0


# ----------------------------------------------------------------- sampling


def test_seeded_sampling_reproducible() -> None:
    sp = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    alone = make_engine(seed=0).generate([tokens(10)], sp)[0]
    crowded = make_engine(seed=0).generate([tokens(10), tokens(30, 1), tokens(3, 2)],
                                           [sp, SamplingParams(max_tokens=5, temperature=1.0),
                                            SamplingParams(max_tokens=9, temperature=0.5)])[0]
    other = make_engine(seed=0).generate([tokens(10)], SamplingParams(
        max_tokens=12, temperature=0.9, top_p=0.95, seed=99, ignore_eos=True))[0]
    assert alone == crowded
    assert alone != other


def test_sampler_limits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    reqs = [Request(str(i), [1], sp) for i, sp in enumerate([
        SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=1e-6),
        SamplingParams(temperature=1e-4, seed=3), SamplingParams(temperature=1.0)])]
    out = Sampler(0)(logits, reqs)
    argmax = logits.argmax(-1).tolist()
    assert out[:3] == argmax[:3] and 0 <= out[3] < 50
    counts = np.bincount([Sampler(s)(logits[3:4] * 0, reqs[3:4])[0] for s in range(400)], minlength=50)
    assert counts.max() < 40  # flat logits spread over the vocabulary


def test_a_vanishing_temperature_samples_greedily_not_padding() -> None:
    """1e-39 overflowed logits / temperature in float32: NaN probabilities and token id 0 every step."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 8
    reqs = [Request(str(i), [1], SamplingParams(temperature=t)) for i, t in enumerate((1e-39, 1e-30, 9e-6))]
    assert all(r.sampling.greedy for r in reqs)
    assert Sampler(0)(logits, reqs) == logits.argmax(-1).tolist()


def test_seeds_2_32_or_2_63_apart_draw_differently() -> None:
    """torch's CPU generator reads a seed's low 32 bits, and the noise seed kept the seed's low bits in its own:
    seed s, s + 2**32 and s + 2**63 (0 and -(2**63)) drew the same tokens."""
    flat = torch.zeros(1, 1 << 16)

    def draw(seed: int) -> int:
        return Sampler(0)(flat, [Request("r", [1], SamplingParams(temperature=1.0, seed=seed))])[0]

    assert draw(5) == draw(5)
    assert len({draw(s) for s in (5, 5 + 2**32, 5 + 2**63, 0, -(2**63), 2**64 - 1)}) == 6


# ----------------------------------------------------------------- validation


def test_bad_inputs_name_the_field(tmp_path: Path) -> None:
    def field(fn) -> str:
        with pytest.raises(ConfigError) as info:
            fn()
        return info.value.field

    assert field(lambda: create_engine(EngineConfig(model="no-such-preset"))) == "model"
    assert field(lambda: EngineConfig(chunk_budget=0)) == "chunk_budget"
    assert field(lambda: EngineConfig(chunk_budget=-5)) == "chunk_budget"
    assert field(lambda: create_engine(EngineConfig(model=str(tmp_path)))) == "model"  # no config.json
    write_config(tmp_path, TINY)
    with pytest.raises(ConfigError, match="safetensors") as info:
        create_engine(EngineConfig(model=str(tmp_path), kv_blocks=64))
    assert info.value.field == "model"
    assert field(lambda: make_engine(max_model_len=10**6)) == "max_model_len"
    roomy = make_engine()
    assert field(lambda: roomy.add_request(tokens(1024), FORCED)) == "prompt"
    assert field(lambda: roomy.add_request(tokens(1022), FORCED)) == "max_tokens"
    engine = make_engine(kv_blocks=8)
    assert field(lambda: engine.add_request(tokens(200), FORCED)) == "prompt"  # more blocks than exist
    assert field(lambda: engine.add_request(tokens(120), SamplingParams(max_tokens=20))) == "max_tokens"
    assert field(lambda: engine.add_request([], FORCED)) == "prompt"
    assert field(lambda: engine.add_request("", FORCED)) == "prompt"
    assert field(lambda: engine.add_request([5, TINY.vocab_size], FORCED)) == "prompt"
    assert field(lambda: engine.add_request([5, -1], FORCED)) == "prompt"
    engine.add_request([5], FORCED, request_id="dup")
    assert field(lambda: engine.add_request([6], FORCED, request_id="dup")) == "request_id"


def test_kv_block_sizing() -> None:
    cfg = EngineConfig(model="tiny", max_num_seqs=4, kv_memory_gib=1.0)
    assert num_kv_blocks(cfg, TINY, 1024, 4) == 4 * 64  # capped at max_num_seqs full requests
    tiny_mem = cfg.with_(kv_memory_gib=1e-6)
    assert num_kv_blocks(tiny_mem, TINY, 1024, 4) == 64  # never below one full request
    block_bytes = TINY.kv_bytes_per_token(4) * 16
    mid = cfg.with_(kv_memory_gib=100 * block_bytes / 2**30)
    assert num_kv_blocks(mid, TINY, 1024, 4) == 100
    assert num_kv_blocks(cfg.with_(kv_blocks=7), TINY, 1024, 4) == 7



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_kv_storage_is_zeroed_writable_and_huge_page_aligned(dtype) -> None:
    cache = _zeros((300, 16, 2, 32), dtype, torch.device("cpu"))
    assert cache.shape == (300, 16, 2, 32) and cache.dtype == dtype and cache.is_contiguous()
    assert cache.data_ptr() % HUGE_PAGE == 0  # every whole 2 MB of it can be one huge page
    assert not cache.any()
    cache[7, 3] = 1.5
    assert cache.sum().item() == 1.5 * 64 and cache[7, 3, 1, 31].item() == 1.5
    other = _zeros((4, 16, 2, 32), dtype, torch.device("cpu"))
    assert not other.any()  # a fresh mapping, not the first one's pages


# ----------------------------------------------------------------- tokenizers and checkpoints


def test_byte_tokenizer() -> None:
    tok = ByteTokenizer(512)
    ids = tok.encode("héllo ✓")
    assert len(ids) == len("héllo ✓".encode()) and min(ids) >= 3 and max(ids) < 259
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode([0, 1, 2]) == ""
    assert tok.decode([300, 511]).isprintable()
    small = ByteTokenizer(100)
    assert max(small.encode("\xff~")) < 100 and isinstance(small.decode(small.encode("abc")), str)


def write_config(path: Path, cfg: ModelConfig) -> None:
    s = cfg.rope_scaling
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": cfg.rope_theta,
           "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings,
           "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
           "rope_scaling": None if s is None else {
               "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
               "high_freq_factor": s.high_freq_factor,
               "original_max_position_embeddings": s.original_max_position_embeddings}}
    (path / "config.json").write_text(json.dumps(raw))


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "<s>", "</s>", "[UNK]"])
    words = "the quick brown fox jumps over the lazy dog while a slow red cat sleeps".split()
    tok.train_from_iterator([" ".join(words)] * 3, trainer)
    tok.save(str(path / "tokenizer.json"))


def save_sharded(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / file))
        weight_map.update(dict.fromkeys(keys, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    memory = make_engine(seed=3)
    write_config(tmp_path, TINY)
    write_tokenizer(tmp_path)
    save_sharded(tmp_path, hf_state_dict(memory.runner.model))
    disk = create_engine(EngineConfig(model=str(tmp_path), kv_blocks=256, max_model_len=1024, seed=0))
    assert isinstance(disk.tokenizer, HFTokenizer)
    assert disk.model_config.path == str(tmp_path) and disk.model_config.rope_scaling == TINY.rope_scaling
    ids = disk.tokenizer.encode("the lazy dog jumps over the quick brown fox")
    assert len(ids) == 9 and disk.tokenizer.decode(ids[:2]) == "the lazy"
    prompts = [ids, tokens(40), tokens(3, 1)]
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    assert disk.generate(prompts, sp) == memory.generate(prompts, sp)
    text_req = disk.add_request("the slow red cat", sp)
    run(disk)
    assert text_req.prompt_token_ids == disk.tokenizer.encode("the slow red cat")


def test_checkpoint_errors(tmp_path: Path) -> None:
    memory = make_engine()
    write_config(tmp_path, TINY)
    weights = hf_state_dict(memory.runner.model)
    missing = {k: v for k, v in weights.items() if "layers.1.mlp.up_proj" not in k}
    save_file(missing, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="layers.1.mlp.up_proj") as info:
        create_engine(EngineConfig(model=str(tmp_path), kv_blocks=64))
    assert info.value.field == "model"
    bad = dict(weights, **{"model.norm.weight": torch.ones(7)})
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="shape"):
        create_engine(EngineConfig(model=str(tmp_path), kv_blocks=64))


def test_every_listed_eos_id_ends_generation(tmp_path) -> None:
    """Instruct models list several EOS ids in config.json; each one stops a request that heeds EOS."""
    import json
    from dataclasses import replace

    from itlbench.core.hf_config import hf_config_dict
    from itlbench.core.presets import model_config_from_hf_dir

    listed = replace(TINY, extra_eos_token_ids=tuple(i for i in range(TINY.vocab_size) if i != 2))
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(listed)))
    loaded = model_config_from_hf_dir(tmp_path)
    assert loaded.eos_token_ids == set(range(TINY.vocab_size))  # every id ends a turn
    engine = create_engine(EngineConfig(model="tiny", kv_blocks=64, seed=0), replace(loaded, path=None))  # dummy weights
    heeds = engine.add_request(tokens(9), SamplingParams(max_tokens=10, temperature=0))
    ignores = engine.add_request(tokens(9), SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    run(engine)
    assert heeds.finish_reason == "stop" and heeds.num_output_tokens == 1
    assert ignores.finish_reason == "length" and ignores.num_output_tokens == 10
