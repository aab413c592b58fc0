"""Readings of transformers' paged cache that the continuous-batching manager does not expose: its
blocks free and used, and the prompt tokens served from shared (prefix) blocks."""
from __future__ import annotations

from typing import Callable


def kv_blocks(cache) -> tuple[int, int]:
    """(free, used) whole-model blocks; blocks kept only for prefix reuse are evictable, so they
    count free."""
    total = int(cache.num_blocks)
    cached = sum(len(a.ledger.cached_blocks) for a in cache.cache_allocators.values())
    free = min(total, round(cache.compute_free_capacity() * total) + cached)
    return free, total - free


def count_prefix_hits(cache, on_hit: Callable[[int], None]) -> None:
    """Count prompt tokens served from shared blocks: wrap the cache's prefix lookup (the manager
    exposes no counter). The scheduler calls it once per request that starts prefilling; `on_hit`
    gets each count."""
    lookup = cache.search_prefix_match

    def counted(request_id, prompt_ids):
        n = lookup(request_id, prompt_ids)
        on_hit(n)
        return n

    cache.search_prefix_match = counted
