"""Paged KV-cache bookkeeping: which fixed-size blocks each request owns, and which are shareable.

Torch-free: it only hands out block ids; the runner turns them into slot indices. A block is shared
only once it is full and computed, so its contents never change afterwards and no copy-on-write is
needed. Freed blocks that carry a prefix hash stay matchable until a fresh allocation reuses them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from itlbench.core.request import Request

BlockHash = int


@dataclass
class Block:
    """One KV block. `block_hash` is set only while it is registered in the prefix cache."""

    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    parent_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()


def chain_hash(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a block that also commits to everything before it, so equal hashes mean equal prefixes."""
    return hash((parent, tuple(token_ids)))


class BlockManager:
    """Reference-counted block pool with a hash-chained prefix cache and LRU-ish eviction."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref-0 blocks in eviction order: the front is reused first.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        # Per live request: hashes of its full, computed blocks (chain state for cache_full_blocks).
        self._hashes: dict[str, list[BlockHash]] = {}
        self._live: dict[str, Request] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return (self.num_blocks - len(self._free)) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Longest run of cached full blocks equal to the prefix of `token_ids`; takes no references."""
        if not self.prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent: BlockHash | None = None
        for i in range(min(len(token_ids), max_tokens) // bs):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, tokens)
            block_id = self._cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:
                break  # hash collision: treat as a miss rather than serve wrong KV
            hits.append(block_id)
            parent = h
        return hits

    def allocate(self, request: Request, num_tokens: int, prefix_blocks: Sequence[int] = ()) -> bool:
        """Grow `request.block_ids` to cover `num_tokens` slots; all-or-nothing."""
        prefix = list(prefix_blocks) if not request.block_ids else []
        have = len(request.block_ids) + len(prefix)
        fresh = max(0, self.blocks_for(num_tokens) - have)
        revived = sum(1 for b in prefix if self.blocks[b].ref_count == 0)
        if fresh + revived > len(self._free):
            return False
        if not request.block_ids:
            self._take_prefix(request, prefix)
        for _ in range(fresh):
            request.block_ids.append(self._pop_free())
        if request.block_ids:
            self._live[request.request_id] = request
        return True

    def _take_prefix(self, request: Request, prefix: list[int]) -> None:
        hashes: list[BlockHash] = []
        for block_id in prefix:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            request.block_ids.append(block_id)
            assert block.block_hash is not None, "prefix blocks must come from match_prefix"
            hashes.append(block.block_hash)
        self._hashes[request.request_id] = hashes

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        self._uncache(block)
        block.ref_count = 1
        return block_id

    def _uncache(self, block: Block) -> None:
        if block.block_hash is not None and self._cached.get(block.block_hash) == block.block_id:
            del self._cached[block.block_hash]
        block.block_hash = None
        block.parent_hash = None
        block.token_ids = ()

    def cache_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's newly full, computed blocks so later prompts can share them."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = min(num_computed_tokens // bs, len(request.block_ids))
        for i in range(len(hashes), num_full):
            tokens = tuple(request.token_slice(i * bs, (i + 1) * bs))
            parent = hashes[-1] if hashes else None
            h = chain_hash(parent, tokens)
            hashes.append(h)
            block = self.blocks[request.block_ids[i]]
            if block.block_hash is None and h not in self._cached:
                block.block_hash, block.parent_hash, block.token_ids = h, parent, tokens
                self._cached[h] = block.block_id

    def free(self, request: Request) -> None:
        """Drop the request's references; tail blocks go first in line for eviction."""
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    # Nothing worth keeping: reuse before any block that still holds a cached prefix.
                    self._free.move_to_end(block_id, last=False)
        request.block_ids.clear()
        self._hashes.pop(request.request_id, None)
        self._live.pop(request.request_id, None)

    def check_invariants(self) -> None:
        """Raise AssertionError on any inconsistency between ref counts, the free pool and the cache."""
        holders: Counter[int] = Counter()
        for rid, req in self._live.items():
            assert req.request_id == rid, f"live request renamed: {rid} -> {req.request_id}"
            assert req.block_ids, f"live request {rid} holds no blocks"
            assert len(set(req.block_ids)) == len(req.block_ids), f"{rid} holds a block twice"
            holders.update(req.block_ids)
        for block in self.blocks:
            b = block.block_id
            assert block.ref_count == holders[b], f"block {b}: ref {block.ref_count} != holders {holders[b]}"
            assert (block.ref_count == 0) == (b in self._free), f"block {b}: ref {block.ref_count} vs free pool"
            if block.block_hash is not None:
                assert self._cached.get(block.block_hash) == b, f"block {b} hash not registered"
                assert len(block.token_ids) == self.block_size, f"cached block {b} is not full"
        for h, b in self._cached.items():
            assert self.blocks[b].block_hash == h, f"cache entry {h} points at block {b} with another hash"
        assert len(self._free) + sum(1 for blk in self.blocks if blk.ref_count > 0) == self.num_blocks
        assert 0.0 <= self.usage <= 1.0
