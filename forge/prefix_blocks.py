"""Block-aligned prefix hashes, and bounded memories of which prefixes went where.

Engines reuse KV only in whole blocks, and a block is reusable only if every block before it
matches too. So the hash of block i covers block i-1's hash: two prompts share the first k chain
hashes exactly when they share their first k full blocks. Python hashes tuples of ints the same in
every process (only str/bytes hashing is salted), so these keys are stable."""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Optional, Sequence


def chain_hashes(
    tokens: tuple[int, ...], tokens_per_block: int, limit: Optional[int] = None
) -> list[int]:
    """Chain hash of each full block of `tokens` (at most `limit` of them); a partial tail block has
    none."""
    n = len(tokens) // tokens_per_block
    if limit is not None and limit < n:
        n = limit
    h = tokens_per_block  # seed: the same tokens in different block sizes never share a key
    out = []
    for start in range(0, n * tokens_per_block, tokens_per_block):
        h = hash((h, tokens[start:start + tokens_per_block]))
        out.append(h)
    return out


class BoundedLRU:
    """A mapping that forgets its least recently used keys beyond `capacity` (e.g. prefix -> engine
    pins)."""

    __slots__ = ("capacity", "_d")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Hashable, default=None):
        return self._d.get(key, default)

    def put(self, key: Hashable, value) -> None:
        d = self._d
        if key in d:
            d.move_to_end(key)
        d[key] = value
        if len(d) > self.capacity:
            d.popitem(last=False)

    def holds(self, h: int) -> bool:
        """Whether this block was sent and not yet forgotten (recency untouched)."""
        return h in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d


class BlockMirror:
    """What one engine's block cache probably holds: the chain hashes last dispatched to it, bounded
    by the engine's KV block count so the estimate forgets as the engine's cache would."""

    __slots__ = ("capacity", "_d")

    def __init__(self, capacity_blocks: int):
        self.capacity = max(1, capacity_blocks)
        self._d: OrderedDict = OrderedDict()

    def dispatch(self, hashes: Sequence[int]) -> int:
        """Record a prompt's blocks as sent; return how many leading blocks were already there."""
        d = self._d
        matched = 0
        missed = False
        for h in hashes:
            if h in d:
                d.move_to_end(h)
                if not missed:
                    matched += 1
            else:
                missed = True
                d[h] = None
        while len(d) > self.capacity:
            d.popitem(last=False)
        return matched

    def holds(self, h: int) -> bool:
        """Whether this block was sent and not yet forgotten (recency untouched)."""
        return h in self._d

    def __len__(self) -> int:
        return len(self._d)
