"""A step's chunks flatten into rows as attention and the cache writes expect them: decode-only steps
(their own fast path) and mixed steps alike, against values written out by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from itlbench.engine.batch import flatten
from itlbench.engine.request import Request, SamplingParams
from itlbench.engine.scheduler_output import ScheduledChunk, SchedulerOutput

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
