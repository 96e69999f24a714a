"""A step's chunks flatten into rows as attention and the cache writes expect them: decode-only steps
(their own fast path) and mixed steps alike, against values written out by hand."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.core.request import Request, SamplingParams
from itlbench.core.scheduler_output import ScheduledChunk, SchedulerOutput
from itlbench.engine.batch import flatten

BS = 4


def request(i: int, prompt: int, outputs: int, rng: np.random.Generator) -> Request:
    req = Request(f"r{i}", rng.integers(3, 500, prompt).tolist(), SamplingParams(max_tokens=100))
    req.output_token_ids = rng.integers(3, 500, outputs).tolist()
    req.block_ids = rng.permutation(1000)[: -(-(prompt + outputs) // BS)].tolist()
    return req


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 9), st.integers(0, 1)), min_size=1, max_size=9),
       seed=st.integers(0, 2**31 - 1))
def test_rows_positions_slots_and_sampling_rows(shape, seed) -> None:
    rng = np.random.default_rng(seed)
    chunks, expect = [], []
    for i, (prompt, outputs, whole) in enumerate(shape):
        req = request(i, prompt, outputs, rng)
        total = req.num_tokens
        # a decode (the last token) or, for `whole`, a chunk ending at the last token; either samples
        start = total - 1 if not whole or outputs else 0
        tokens = (req.prompt_token_ids + req.output_token_ids)[start:total]
        chunks.append(ScheduledChunk(req, start, total - start, is_decode=total - start == 1))
        expect += [(tok, pos, req.block_ids[pos // BS] * BS + pos % BS) for pos, tok in enumerate(tokens, start)]
    batch = flatten(SchedulerOutput(chunks), BS)
    rows = list(zip(batch.input_ids.tolist(), batch.positions.tolist(), batch.slot_mapping.tolist(), strict=True))
    assert rows == expect
    ends = np.cumsum([c.num_new_tokens for c in chunks])
    assert batch.logits_indices.tolist() == (ends - 1).tolist()  # every chunk here reaches its last token
    assert batch.query_start_loc.tolist() == [0, *ends.tolist()]
    assert batch.seq_lens.tolist() == [c.start + c.num_new_tokens for c in chunks]
    for i, c in enumerate(chunks):
        n = -(-(c.start + c.num_new_tokens) // BS)
        assert batch.block_tables[i, :n].tolist() == c.request.block_ids[:n]
        assert not batch.block_tables[i, n:].any()


def test_a_one_token_chunk_short_of_the_prompt_end_does_not_sample() -> None:
    """A step of one-token chunks takes the decode path; a prefill chunk of one token in the middle of
    its prompt computes a row but yields no token, so it has no logits row."""
    rng = np.random.default_rng(3)
    decoding, prefilling, last = request(0, 9, 2, rng), request(1, 30, 0, rng), request(2, 5, 1, rng)
    chunks = [ScheduledChunk(decoding, 10, 1, is_decode=True), ScheduledChunk(prefilling, 12, 1, is_decode=False),
              ScheduledChunk(last, 5, 1, is_decode=True)]
    batch = flatten(SchedulerOutput(chunks), BS)
    assert batch.logits_indices.tolist() == [0, 2]
    assert batch.sample_requests == (decoding, last)
    assert batch.input_ids.tolist() == [decoding.token_at(10), prefilling.token_at(12), last.token_at(5)]
    assert batch.slot_mapping.tolist() == [r.block_ids[p // BS] * BS + p % BS
                                           for r, p in ((decoding, 10), (prefilling, 12), (last, 5))]
    assert batch.block_tables.tolist() == [decoding.block_ids[:3] + [0], prefilling.block_ids[:4],
                                           last.block_ids[:2] + [0, 0]]
    assert batch.seq_lens.tolist() == [11, 13, 6] and batch.seq_lens_np.tolist() == [11, 13, 6]
    assert batch.starts_np.tolist() == [10, 12, 5] and batch.query_lens_np.tolist() == [1, 1, 1]
    assert batch.query_start_loc.tolist() == [0, 1, 2, 3]
    assert (batch.block_tables.dtype, batch.seq_lens.dtype, batch.slot_mapping.dtype) == (
        torch.int32, torch.int32, torch.int64)


def test_an_engine_advances_its_decode_batch_in_place_as_flatten_would_build_it() -> None:
    """Over a run with arrivals, finishes and block edges, every step's batch equals a fresh flatten of
    the same schedule, and most decode steps reuse the previous batch's arrays."""
    from itlbench.core.engine_config import EngineConfig
    from itlbench.engine.batch import Flattener
    from itlbench.serving.build import create_engine

    engine = create_engine(EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=256, max_model_len=1024,
                                 block_size=4))
    flattener, real = Flattener(4), engine.runner._flatten
    seen = {"reused": 0, "steps": 0}

    def checked(output: SchedulerOutput):
        previous = flattener._last
        batch = flattener(output)
        fresh = flatten(output, 4)
        seen["steps"] += 1
        seen["reused"] += batch is previous
        for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
                     "logits_indices"):
            assert torch.equal(getattr(batch, name), getattr(fresh, name)), name
        for name in ("query_lens_np", "starts_np", "seq_lens_np", "block_tables_np"):
            assert np.array_equal(getattr(batch, name), getattr(fresh, name)), name
        assert batch.request_ids == fresh.request_ids and batch.sample_requests == fresh.sample_requests
        return real(output)

    engine.runner._flatten = checked
    rng = np.random.default_rng(1)
    for wave in range(3):
        for n in (3, 9, 14, 30):
            engine.add_request(rng.integers(3, 500, n + wave).tolist(),
                               SamplingParams(max_tokens=int(rng.integers(5, 40)), temperature=0.0, ignore_eos=True))
        for _ in range(12):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    assert seen["reused"] > seen["steps"] // 3
