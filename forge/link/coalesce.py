"""Calls coalesced into batches: each call is an item and a future; the calls that arrive within
`linger_s` of the first (or until `max_batch` of them wait) go out together, one `send(batch)` task
per batch of at most `max_batch`. Used where one round trip per call would cap throughput: the texts
a node tokenizes through its hosts (forge/link/encoder.py) and the bulk calls of a remote node's
POSTs (forge/node/remote.py).

`send` owns its batch: it must resolve every future of it, whatever happens. One event loop owns a
Coalescer."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Optional, TypeVar

Item = TypeVar("Item")


class Coalescer(Generic[Item]):
    def __init__(
        self,
        send: Callable[[list[tuple[Item, asyncio.Future]]], Awaitable[None]],
        *,
        max_batch: int,
        linger_s: float,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._send, self.max_batch, self.linger_s = send, max_batch, linger_s
        self._pending: list[tuple[Item, asyncio.Future]] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self.tasks: set[asyncio.Task] = set()          # batches being sent

    def add(self, item: Item) -> asyncio.Future:
        """Queue one call; its future is resolved by the `send` of the batch it goes out in."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((item, fut))
        if len(self._pending) >= self.max_batch:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self.flush)
        return fut

    def flush(self) -> None:
        """Send everything waiting now, in batches of at most max_batch."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            task = asyncio.ensure_future(self._send(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def cancel(self) -> None:
        """No linger ends in a send any more (what waits stays unsent), and the batches being sent
        are cancelled (their `send` resolves their futures as it ends)."""
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
