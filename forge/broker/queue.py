"""Broker: the asyncio face of BrokerCore — bounded, with back-pressure on producers and bounded
waits for engines. One event loop owns it; every method is called from that loop."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional, Sequence

from forge.broker.core import BrokerCore
from forge.broker.types import BrokerClosed, BrokerRequest, QueueFull
from forge.stats import BrokerStats


class Broker:
    def __init__(self, core: BrokerCore):
        self.core = core
        self._putters: deque[asyncio.Future] = deque()   # producers waiting for room, oldest first
        self._takers: set[asyncio.Future] = set()        # engines waiting for work
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ producers
    async def put(self, req: BrokerRequest, *, timeout_s: Optional[float] = None) -> None:
        """Queue `req`, waiting while the broker is full. NoEngineFits and BrokerClosed are raised
        at once; QueueFull if it is still full after `timeout_s` (None: wait as long as it
        takes)."""
        self._refuse_if_closed()
        if not self.core.has_room():
            self.core.check(req)  # refused before waiting; with room, add() refuses it the same way
            await self._wait_for_room(timeout_s)
        self.core.add(req)
        self._wake_takers()

    def put_nowait(self, req: BrokerRequest) -> None:
        """Queue `req` or raise QueueFull / NoEngineFits / BrokerClosed right away."""
        self._refuse_if_closed()
        self.core.add(req)
        self._wake_takers()

    async def _wait_for_room(self, timeout_s: Optional[float]) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        first = True
        while not self.core.has_room():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueFull(f"broker on node {self.core.node} stayed full for {timeout_s} s")
            fut = loop.create_future()
            # A producer woken but beaten to the room keeps its place at the head of the line.
            self._putters.append(fut) if first else self._putters.appendleft(fut)
            first = False
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._putters.remove(fut)
                except ValueError:
                    pass
            self._refuse_if_closed()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise BrokerClosed(f"broker on node {self.core.node} is closed")

    # ------------------------------------------------------------------ engines
    async def take(self, engine_id: str, *, free_slots: int, free_kv_blocks: int,
                   timeout_s: float) -> list[BrokerRequest]:
        """A batch for this engine, waiting up to `timeout_s` for one; [] on timeout. After close,
        what is still pending is handed out; once nothing is, BrokerClosed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            batch = self.core.take(engine_id, free_slots=free_slots, free_kv_blocks=free_kv_blocks)
            if batch:
                self._wake_putters(len(batch))
                return batch
            if self._closed and not self.core.pending():
                raise BrokerClosed(f"broker on node {self.core.node} is closed and empty")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            fut = loop.create_future()
            self._takers.add(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                return []
            finally:
                self._takers.discard(fut)

    def requeue(self, reqs: Sequence[BrokerRequest]) -> None:
        self.core.requeue(reqs)
        self._wake_takers()

    def on_done(self, engine_id: str, req: BrokerRequest) -> None:
        self.core.on_done(engine_id, req)
        if self.core.pending():
            self._wake_takers()  # loads changed: a tail cap or an affinity bound may have lifted

    def on_done_many(self, engine_id: str, reqs: Sequence[BrokerRequest]) -> None:
        """on_done for each of `reqs` (one link's collect), waking the takers once."""
        self.core.on_done_many(engine_id, reqs)
        if self.core.pending():
            self._wake_takers()

    def record_delivery(
        self, engine_id: str, tokens: int, elapsed_s: float, occupancy: float = 1.0
    ) -> None:
        self.core.record_delivery(engine_id, tokens, elapsed_s, occupancy)

    def set_engine_healthy(self, engine_id: str, healthy: bool) -> None:
        self.core.set_engine_healthy(engine_id, healthy)
        self._wake_takers()

    # ------------------------------------------------------------------ control
    def close(self) -> None:
        """Refuse new puts (BrokerClosed); wake every waiter. Pending work can still be taken."""
        self._closed = True
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
        self._wake_takers()

    def notify(self) -> None:
        """Wake waiting takers (e.g. an engine freed capacity)."""
        self._wake_takers()

    def drain(self) -> list[BrokerRequest]:
        """Remove and return everything pending; waiting producers get their turn."""
        out = self.core.drain()
        self._wake_putters(len(out))
        return out

    def stats(self) -> BrokerStats:
        return self.core.stats()

    def pending(self) -> int:
        return self.core.pending()

    def has_room(self) -> bool:
        return self.core.has_room()

    # ------------------------------------------------------------------ wake-ups
    def _wake_takers(self) -> None:
        if self._takers:
            for fut in self._takers:
                if not fut.done():
                    fut.set_result(None)
            self._takers.clear()

    def _wake_putters(self, n: int) -> None:
        while n > 0 and self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1
