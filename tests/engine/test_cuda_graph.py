"""Decode CUDA graphs: bucketing, padding into the scratch block, and the fixed-buffer forward (run
eagerly here, through the Triton kernels in the CPU interpreter) matching the eager engine step."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from itlbench.core.request import SamplingParams  # noqa: E402
from itlbench.engine.attention.cases import make_case  # noqa: E402
from itlbench.engine.batch import flatten  # noqa: E402
from itlbench.engine.cuda_graph import DecodeGraphs, bucket_for, graph_buckets, is_uniform_decode  # noqa: E402
from tests.support.models import TINY, make_engine, prompts  # noqa: E402

torch.set_num_threads(1)
CPU = torch.device("cpu")


def test_buckets() -> None:
    assert graph_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert graph_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert graph_buckets(4) == (1, 2, 4)
    assert graph_buckets(1) == (1,)
    buckets = graph_buckets(64)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 8, 9, 17, 33, 64)] == [1, 2, 4, 8, 8, 16, 24, 40, 64]
    assert bucket_for(65, buckets) is None  # more requests than any graph: eager


class _Recorder:
    """A backend stand-in that returns the metadata it was given (the buffers the graph would read)."""

    name = "recorder"

    def decode_metadata(self, *buffers: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return buffers


def _graphs(scratch: int, block_size: int, max_blocks: int = 8) -> DecodeGraphs:
    return DecodeGraphs(lambda ids, pos, meta: ids.float()[:, None], _Recorder(), (1, 2, 4, 8), max_blocks,
                        scratch, block_size, CPU, capture=False)


def test_padding_rows_point_at_the_scratch_block_only() -> None:
    full = make_case([5, 20, 33, 0], [1, 1, 1, 1], heads=4, kv_heads=1, head_dim=16, block_size=16)
    three = make_case([7, 40, 2], [1, 1, 1], heads=4, kv_heads=1, head_dim=16, block_size=16, seed=1)
    assert is_uniform_decode(full.batch) and not is_uniform_decode(
        make_case([0], [3], heads=4, kv_heads=1, head_dim=16, block_size=16).batch)
    scratch = 99
    g = _graphs(scratch, 16)
    assert g.load(full.batch) == 4
    assert g.load(three.batch) == 4  # row 3 held a real request a step ago; now it is padding
    assert torch.equal(g.slot_mapping[:3], three.batch.slot_mapping)
    assert g.slot_mapping[3].item() == scratch * 16
    assert g.seq_lens[3].item() == 1 and g.input_ids[3].item() == 0 and g.positions[3].item() == 0
    assert (g.block_tables[3] == scratch).all()
    width = three.batch.block_tables.shape[1]
    assert torch.equal(g.block_tables[:3, :width], three.batch.block_tables)
    meta = g.backend.decode_metadata(g.slot_mapping[:4], g.query_start_loc[:5], g.seq_lens[:4], g.block_tables[:4])
    assert meta[1].tolist() == [0, 1, 2, 3, 4]  # one query row per request
    # every slot a padded row can write lies in the scratch block
    padded = g.slot_mapping[3:4]
    assert ((padded // 16) == scratch).all()
    with pytest.raises(ValueError):
        g.load(make_case([0] * 9, [1] * 9, heads=4, kv_heads=1, head_dim=16, block_size=16).batch)


def test_fixed_buffer_decode_matches_eager_and_writes_no_real_block() -> None:
    engine = make_engine(TINY, attention="triton", max_num_seqs=8, kv_blocks=64)
    runner = engine.runner
    assert runner.graphs is None and runner.scratch_block == runner.num_blocks == 64
    assert runner.kv_caches[0][0].shape[0] == 65  # the scratch block sits past the manager's blocks
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for p in prompts(TINY, (3, 17, 30)):
        engine.add_request(p, greedy)
    while engine.num_waiting or any(not r.is_decoding for r in engine.scheduler.running):
        engine.step()
    output = engine.scheduler.schedule()
    batch = flatten(output, engine.config.block_size, runner.device)
    assert is_uniform_decode(batch) and batch.num_reqs == 3  # bucket 4: one padded row

    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    graphs = runner.build_decode_graphs(capture=False)
    with torch.inference_mode():
        fixed = graphs.run(batch)[batch.logits_indices]
    after_fixed = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
        k.copy_(k0)
        v.copy_(v0)
    eager = runner.execute(batch)
    torch.testing.assert_close(fixed, eager, atol=1e-5, rtol=0)

    real = runner.num_blocks
    written = torch.zeros(real * engine.config.block_size, dtype=torch.bool)
    written[batch.slot_mapping] = True
    for (kf, vf), (ke, ve), (k0, _) in zip(after_fixed, runner.kv_caches, before, strict=True):
        # real blocks: as the eager step left them (GEMMs over 4 rows instead of 3 may round
        # differently), and changed only at this step's own slots
        torch.testing.assert_close(kf[:real], ke[:real], atol=1e-5, rtol=0)
        torch.testing.assert_close(vf[:real], ve[:real], atol=1e-5, rtol=0)
        changed = (kf[:real] != k0[:real]).flatten(2).any(-1).flatten()
        assert not (changed & ~written).any()
        assert kf[real].abs().sum() > 0  # the padded row wrote its K into the scratch block



def test_kv_pool_sized_from_free_device_memory() -> None:
    """On CUDA (free_bytes given) the pool is gpu_memory_fraction of free memory less one step's
    activations and a fixed reserve; an explicit kv_memory_gib or kv_blocks still wins."""
    from itlbench.core.engine_config import EngineConfig
    from itlbench.core.presets import PRESETS
    from itlbench.engine.runner import CUDA_RESERVE_BYTES, GIB, activation_bytes, num_kv_blocks

    model = PRESETS["llama-3.1-8b"]
    cfg = EngineConfig(model=model.name, chunk_budget=2048, max_num_seqs=64, gpu_memory_fraction=0.9)
    free = 120 * GIB
    block_bytes = model.kv_bytes_per_token(2) * 16
    assert block_bytes == 131_072 * 16  # the source documents' 128 KiB per token
    want = int((free * 0.9 - CUDA_RESERVE_BYTES - activation_bytes(model, 2048, 2)) // block_bytes)
    assert num_kv_blocks(cfg, model, 131_072, 2, 16, free) == want
    # unchunked: one step may carry a whole max_model_len prompt, so more is held back
    unchunked = num_kv_blocks(cfg.with_(chunk_budget=None), model, 131_072, 2, 16, free)
    assert unchunked < want
    assert num_kv_blocks(cfg.with_(kv_memory_gib=2.0), model, 131_072, 2, 16, free) == max(
        2 * GIB // block_bytes, 131_072 // 16)
    assert num_kv_blocks(cfg.with_(kv_blocks=10), model, 131_072, 2, 16, free) == 10
    # no device memory figure (CPU): 4 GiB
    assert num_kv_blocks(cfg, model, 8192, 2, 16) == 4 * GIB // block_bytes


def test_nvtx_step_ranges_name_the_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step is an NVTX range `step/<phase>` with a mark carrying its token counts (recorded
    here by a stand-in for torch.cuda.nvtx, which needs CUDA)."""
    from itlbench.core import nvtx as instrument

    events: list[tuple[str, str]] = []
    nv = instrument._Nvtx()
    nv._push = lambda name: events.append(("push", name))
    nv._pop = lambda: events.append(("pop", ""))
    nv._mark = lambda note: events.append(("mark", note))
    monkeypatch.setattr(instrument, "_nvtx", nv)
    engine = make_engine(TINY, chunk_budget=8)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request(prompts(TINY, (12,))[0], greedy)
    engine.step()  # 8 of 12 prompt tokens
    engine.add_request(prompts(TINY, (5,), seed=2)[0], greedy)
    while engine.has_unfinished():
        engine.step()
    pushes = [name for kind, name in events if kind == "push" and name.startswith("step/")]
    records = engine.step_log.since(0)
    assert pushes == [f"step/{r.phase}" for r in records]
    # around the forward: the host-side parts of each step, in order
    parts = [name for kind, name in events if kind == "push" and not name.startswith("step/")]
    assert parts == ["schedule", "prepare", "sample", "output"] * len(records)
    assert {"step/prefill", "step/mixed", "step/decode"} <= set(pushes)
    marks = [note for kind, note in events if kind == "mark"]
    assert marks == [f"step/{r.phase} prefill={r.prefill_tokens} decode={r.decode_tokens}" for r in records]
    assert sum(kind == "pop" for kind, _ in events) == 5 * len(records)
