"""Block manager: exact reference counts, no leaks, prefix sharing, eviction of stale hashes."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from itlbench.core.block_manager import BlockManager
from itlbench.core.request import Request, SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=8, ignore_eos=True))


def prefill(bm: BlockManager, req: Request) -> bool:
    """Allocate with prefix hits and mark the whole prompt computed, as the scheduler would."""
    hits = bm.match_prefix(req.prompt_token_ids, req.num_tokens - 1)
    if not bm.allocate(req, req.num_tokens, hits):
        return False
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req, req.num_tokens)
    return True


def test_blocks_for_is_ceil_division() -> None:
    bm = BlockManager(8, 16)
    assert [bm.blocks_for(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_allocate_all_or_nothing() -> None:
    bm = BlockManager(4, 4)
    a = make_request("a", list(range(12)))
    assert bm.allocate(a, 12)
    assert len(a.block_ids) == 3 and bm.num_free_blocks == 1
    b = make_request("b", list(range(8)))
    assert not bm.allocate(b, 8)
    assert b.block_ids == [] and bm.num_free_blocks == 1
    assert bm.allocate(a, 16) and len(a.block_ids) == 4
    assert bm.usage == 1.0
    bm.check_invariants()
    bm.free(a)
    assert a.block_ids == [] and bm.usage == 0.0 and bm.num_free_blocks == 4
    bm.check_invariants()


def test_prefix_sharing_and_divergence() -> None:
    bm = BlockManager(32, 4)
    prompt = list(range(100, 116))  # four full blocks
    a = make_request("a", prompt)
    assert prefill(bm, a)
    b = make_request("b", prompt)
    hits = bm.match_prefix(b.prompt_token_ids, b.num_tokens - 1)
    assert hits == a.block_ids[:3]  # at most num_tokens - 1 tokens: the 4th block is recomputed
    assert bm.allocate(b, b.num_tokens, hits)
    assert b.block_ids[:3] == a.block_ids[:3] and b.block_ids[3] != a.block_ids[3]
    for block_id in a.block_ids[:3]:
        assert bm.blocks[block_id].ref_count == 2
    # Differs at the 4th token: the first block cannot be shared, and nothing after it either.
    c = make_request("c", prompt[:3] + [999] + prompt[4:])
    assert bm.match_prefix(c.prompt_token_ids, c.num_tokens - 1) == []
    d = make_request("d", prompt[:8] + [7, 7, 7, 7, 7])
    assert bm.match_prefix(d.prompt_token_ids, d.num_tokens - 1) == a.block_ids[:2]
    bm.check_invariants()


def test_freed_cached_blocks_stay_matchable_until_reused() -> None:
    bm = BlockManager(4, 4)
    a = make_request("a", list(range(9)))  # 2 full blocks + 1 partial
    assert prefill(bm, a)
    full = a.block_ids[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    b = make_request("b", list(range(9)))
    hits = bm.match_prefix(b.prompt_token_ids, 8)
    assert hits == full
    assert bm.allocate(b, 9, hits)
    assert b.block_ids[:2] == full and bm.num_free_blocks == 1
    bm.check_invariants()
    bm.free(b)
    # Uncached blocks are reused first; the cached prefix survives one more small allocation.
    c = make_request("c", [50, 51, 52, 53, 54, 55, 56, 57])
    assert bm.allocate(c, 8)
    assert set(c.block_ids).isdisjoint(full)
    assert bm.match_prefix(list(range(9)), 8) == full
    bm.free(c)
    # A big allocation must evict the cached hashes it overwrites.
    e = make_request("e", [9] * 16)
    assert bm.allocate(e, 16)
    assert bm.num_cached_blocks == 0
    assert bm.match_prefix(list(range(9)), 8) == []
    bm.check_invariants()


def test_duplicate_content_is_registered_once() -> None:
    bm = BlockManager(8, 2)
    a, b = make_request("a", [1, 2, 3, 4]), make_request("b", [1, 2, 3, 4])
    assert bm.allocate(a, 4) and bm.allocate(b, 4)
    bm.cache_full_blocks(a, 4)
    bm.cache_full_blocks(b, 4)
    assert bm.num_cached_blocks == 2
    bm.check_invariants()
    bm.free(a)
    bm.free(b)
    bm.check_invariants()


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(8, 2, prefix_caching=False)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert prefill(bm, a)
    assert bm.num_cached_blocks == 0
    assert bm.match_prefix([1, 2, 3, 4, 5], 4) == []


def test_check_invariants_catches_corruption() -> None:
    bm = BlockManager(4, 2)
    a = make_request("a", [1, 2, 3])
    assert bm.allocate(a, 3)
    bm.blocks[a.block_ids[0]].ref_count += 1
    with pytest.raises(AssertionError):
        bm.check_invariants()


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate/grow/compute/free/match sequences over a tiny pool with a tiny alphabet,
    so prefixes collide often and allocation failures and evictions are common."""

    live = Bundle("live")

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=2)
        self.requests: dict[str, Request] = {}
        self.counter = 0

    @rule(target=live, tokens=st.lists(st.integers(0, 2), min_size=1, max_size=12))
    def admit(self, tokens: list[int]) -> str:
        self.counter += 1
        req = make_request(f"r{self.counter}", tokens)
        hits = self.bm.match_prefix(tokens, len(tokens) - 1)
        assert len(hits) * 2 <= len(tokens) - 1
        free_before = self.bm.num_free_blocks
        if self.bm.allocate(req, len(tokens), hits):
            assert req.block_ids[: len(hits)] == hits
            assert len(req.block_ids) == self.bm.blocks_for(len(tokens))
            req.num_computed_tokens = len(hits) * 2
            self.requests[req.request_id] = req
        else:
            assert req.block_ids == [] and self.bm.num_free_blocks == free_before
        return req.request_id

    @rule(rid=live, data=st.data())
    def compute(self, rid: str, data: st.DataObject) -> None:
        req = self.requests.get(rid)
        if req is None:
            return
        stop = data.draw(st.integers(req.num_computed_tokens, req.num_tokens))
        req.num_computed_tokens = stop
        self.bm.cache_full_blocks(req, stop)

    @rule(rid=live, new=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def grow(self, rid: str, new: list[int]) -> None:
        req = self.requests.get(rid)
        if req is None or req.num_computed_tokens < req.num_tokens:
            return
        before = list(req.block_ids)
        req.output_token_ids.extend(new)
        if self.bm.allocate(req, req.num_tokens):
            assert req.block_ids[: len(before)] == before
            assert len(req.block_ids) == self.bm.blocks_for(req.num_tokens)
        else:
            del req.output_token_ids[-len(new):]
            assert req.block_ids == before

    @rule(rid=consumes(live))
    def free(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.bm.free(req)
            assert req.block_ids == []
            self.bm.free(req)  # a second free is a no-op, never a double release

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=12))
    def match(self, tokens: list[int]) -> None:
        hits = self.bm.match_prefix(tokens, len(tokens))
        for i, block_id in enumerate(hits):
            assert self.bm.blocks[block_id].token_ids == tuple(tokens[2 * i:2 * i + 2])

    @invariant()
    def consistent(self) -> None:
        self.bm.check_invariants()
        holders = Counter(b for req in self.requests.values() for b in req.block_ids)
        for block in self.bm.blocks:
            assert block.ref_count == holders[block.block_id]
        used = sum(1 for block in self.bm.blocks if block.ref_count > 0)
        assert used + self.bm.num_free_blocks == self.bm.num_blocks
        assert 0.0 <= self.bm.usage <= 1.0
        assert self.bm.usage == pytest.approx(used / self.bm.num_blocks)

    @invariant()
    def computed_blocks_match_their_tokens(self) -> None:
        """Any registered block a live request holds carries exactly that request's tokens."""
        for req in self.requests.values():
            for i, block_id in enumerate(req.block_ids):
                block = self.bm.blocks[block_id]
                if block.block_hash is not None:
                    assert block.token_ids == tuple(req.token_slice(2 * i, 2 * i + 2))


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
