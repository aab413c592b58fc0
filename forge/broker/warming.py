"""Prefix warm-up: a prefix group new to an engine sends one request first, the rest once it is
done.

An engine reuses a prompt's leading blocks only once they are computed. transformers' continuous
batching looks for a request's prefix when it first schedules it and registers a block only after
the forward that completed it; requests of one prefix that start together (one batch, or one step of
chunked prefill) all compute the prefix. Grouping hands a group's requests to its engine together,
so on a prefix-heavy job the broker counted as shared what the engine recomputed: on the 2-core CPU
node the tiny model's engines reused 48.1 % of prompt tokens where the broker estimated 73.5 % (one
engine), 68.8 % vs 75.5 % with two replicas (docs/benchmarks.md, "vLLM on the CPU").

So on such an engine (`Engine.shares_prefix_within_step` False, carried in its EngineGeometry; vLLM
registers a block when it allocates it, so requests of one step share it there and nothing waits),
when a keyed group is cold on the engine (its first block is not in its BlockMirror), the engine
takes one request of it, the leader, and the group's other requests wait until the leader is done or
given back: from then on the prefix is in the engine's cache and the followers reuse it, as the
broker counts. The engine meanwhile takes other groups' work; when it has nothing else and holds
fewer requests than its slots, the followers go at once (batching.py: an idle slot computes
nothing). A group spilled to another engine warms there the same way. The gate is per engine and per
prefix key, so it holds for replicas of one card and for a node of different engines alike. FIFO
mode (no grouping) has no gate: it is the baseline.

Bounded: one entry per request in flight (removed by done, requeue or the engine going
unhealthy)."""
from __future__ import annotations

from typing import Hashable, Optional


class Warming:
    """Per engine: prefix keys whose leader is in flight there, and the leader's request id."""

    __slots__ = ("_by_engine", "_leader")

    def __init__(self, n_engines: int):
        self._by_engine: list[dict[Hashable, str]] = [{} for _ in range(n_engines)]
        self._leader: dict[str, tuple[int, Hashable]] = {}      # request id -> (engine, key)

    def busy(self, i: int, key: Hashable) -> bool:
        """Whether engine i is computing this prefix for a leader now (its followers wait)."""
        return key in self._by_engine[i]

    def start(self, i: int, key: Hashable, request_id: str) -> None:
        self._by_engine[i][key] = request_id
        self._leader[request_id] = (i, key)

    def done(self, request_id: str) -> Optional[int]:
        """The request finished or came back: if it led a prefix, that prefix's followers may go.
        Returns the engine it led on (None when it led nothing)."""
        at = self._leader.pop(request_id, None)
        if at is None:
            return None
        i, key = at
        if self._by_engine[i].get(key) == request_id:
            del self._by_engine[i][key]
        return i

    def release(self, i: int) -> None:
        """Engine i went unhealthy: nothing warms there any more."""
        for rid in self._by_engine[i].values():
            self._leader.pop(rid, None)
        self._by_engine[i].clear()

    def __len__(self) -> int:
        return len(self._leader)
