"""HostQueue: the requests an engine host holds for its one engine until admission takes them.

The node's broker already chose this engine for them (grouping, prefix affinity, balancing by speed)
and its link sent no more than the engine's credit. What is left here is what a one-engine,
grouping-off BrokerCore did for admission, and nothing else (a one-engine broker's balancer lets
every take through, and grouping off means no prefix groups, output classes or warm-up):

- refuse at arrival: QueueFull past `max_pending` queued requests, ValueError for a key already
  queued or not yet done, NoEngineFits for a request the engine's geometry cannot hold (the node
  measured against this geometry, so that is a mismatch, said in words with the numbers);
- take, for the engine's free slots and free KV blocks: the highest priority first and, within it,
  arrival order; each request reserves ceil((prompt + max_new_tokens) / tokens_per_block) blocks; a
  batch's prompts stay within the engine's token budget per step (max_num_tokens), except a first
  prompt longer than the budget, which goes alone; a take stops at the first request that does not
  fit (nothing overtakes it) and never looks below the highest priority; nothing is taken while the
  engine is unhealthy;
- wait for work (bounded) when there is nothing to take; drain everything pending, in the order
  takes would go.

Bounded: at most `max_pending` queued; a key is remembered from add() until done() (admission
settles or gives back every request it takes), or until drain() hands it out. One event loop owns
it; every method is called from it."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional

from forge.broker import EngineGeometry, NoEngineFits, QueueFull, blocks_for, size_problem
from forge.engines.interface import RequestKey
from forge.host.request import HostRequest


class HostQueue:
    def __init__(self, geometry: EngineGeometry, *, node: str, max_pending: int):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.geometry, self.node, self.max_pending = geometry, node, max_pending
        self.healthy = True
        # priority -> its requests in arrival order
        self._levels: dict[int, deque[HostRequest]] = {}
        self._top: Optional[int] = None  # the highest priority with work, None when empty
        self._queued: dict[RequestKey, HostRequest] = {}
        self._taken: set[RequestKey] = set()                  # handed to admission, not done yet
        self._takers: set[asyncio.Future] = set()

    # ------------------------------------------------------------------ arrivals
    def add(self, req: HostRequest) -> None:
        """Queue `req` behind its priority's earlier arrivals; refused as the module docstring
        says."""
        if len(self._queued) >= self.max_pending:
            raise QueueFull(f"engine {self.geometry.engine_id} on node {self.node} holds "
                            f"{len(self._queued)} "
                            f"requests (max_pending)")
        key = req.key
        if key in self._queued or key in self._taken:
            raise ValueError(f"request {key} is already queued or in flight")
        why = size_problem(len(req.prompt), req.max_new_tokens, self.geometry)
        if why is not None:
            raise NoEngineFits(f"{why}: it does not fit engine {self.geometry.engine_id} on node "
                               f"{self.node} "
                               f"(limits: {self.geometry.limits_text()}; request {key})")
        self._queued[key] = req
        prio = req.priority
        level = self._levels.get(prio)
        if level is None:
            level = self._levels[prio] = deque()
            if self._top is None or prio > self._top:
                self._top = prio
        level.append(req)
        if self._takers:
            self._wake()

    def queued(self, key: RequestKey) -> Optional[HostRequest]:
        """The request under `key` while it waits here (not once taken)."""
        return self._queued.get(key)

    # ------------------------------------------------------------------ takes
    def take_now(self, free_slots: int, free_kv_blocks: int) -> list[HostRequest]:
        """One batch within the engine's free slots and KV blocks and its token budget; [] when
        nothing goes now."""
        if free_slots <= 0 or free_kv_blocks <= 0 or self._top is None or not self.healthy:
            return []
        g = self.geometry
        level = self._levels[self._top]
        budget, tpb, queued, taken = g.max_num_tokens, g.tokens_per_block, self._queued, self._taken
        batch: list[HostRequest] = []
        while level and free_slots:
            req = level[0]
            n = len(req.prompt)
            blocks = blocks_for(n, req.max_new_tokens, tpb)
            if blocks > free_kv_blocks or (batch and n > budget):
                break
            level.popleft()
            del queued[req.key]
            taken.add(req.key)
            batch.append(req)
            free_slots -= 1
            free_kv_blocks -= blocks
            if n > budget:                 # an oversized prompt goes alone
                break
            budget -= n
        if not level:
            del self._levels[self._top]
            self._top = max(self._levels) if self._levels else None
        return batch

    async def take(
        self, *, free_slots: int, free_kv_blocks: int, timeout_s: float
    ) -> list[HostRequest]:
        """take_now, waiting up to `timeout_s` for an arrival (or the engine's health back) when it
        gives nothing."""
        batch = self.take_now(free_slots, free_kv_blocks)
        if batch or timeout_s <= 0:
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            fut = loop.create_future()
            self._takers.add(fut)
            try:
                await asyncio.wait_for(fut, deadline - loop.time())
            except asyncio.TimeoutError:
                return []
            finally:
                self._takers.discard(fut)
            batch = self.take_now(free_slots, free_kv_blocks)
            if batch or loop.time() >= deadline:
                return batch

    def done(self, req: HostRequest) -> None:
        """Admission is finished with a request it took (settled or given back); repeated calls are
        no-ops."""
        self._taken.discard(req.key)

    # ------------------------------------------------------------------ health and drain
    def set_healthy(self, healthy: bool) -> None:
        self.healthy = healthy
        if healthy and self._takers:
            self._wake()

    def drain(self) -> list[HostRequest]:
        """Remove and return everything queued: the highest priority first, each in arrival
        order."""
        out = [req for prio in sorted(self._levels, reverse=True) for req in self._levels[prio]]
        self._levels.clear()
        self._queued.clear()
        self._top = None
        return out

    def pending(self) -> int:
        return len(self._queued)

    def in_flight(self) -> int:
        return len(self._taken)

    def _wake(self) -> None:
        for fut in self._takers:
            if not fut.done():
                fut.set_result(None)
        self._takers.clear()
