"""Coalescer (forge/link/coalesce.py): calls within the linger go out as one batch, a full batch
goes at once, and no batch is larger than max_batch."""
from __future__ import annotations

import asyncio

from forge.link.coalesce import Coalescer


def test_calls_within_the_linger_travel_together_and_a_full_batch_goes_at_once():
    sent: list[list[int]] = []

    async def send(batch):
        sent.append([item for item, _ in batch])
        for item, fut in batch:
            fut.set_result(item * 10)

    async def go():
        c = Coalescer(send, max_batch=3, linger_s=0.05)
        first = [c.add(i) for i in range(2)]
        await asyncio.sleep(0.01)
        assert sent == []                                    # still lingering
        assert await asyncio.gather(*first) == [0, 10]
        assert sent == [[0, 1]]
        # 7 calls: two full batches at once, one after the linger
        full = [c.add(i) for i in range(2, 9)]
        await asyncio.sleep(0)
        assert sent == [[0, 1], [2, 3, 4], [5, 6, 7]]
        assert await asyncio.gather(*full) == [i * 10 for i in range(2, 9)]
        assert sent[-1] == [8]

    asyncio.run(go())


def test_cancel_ends_the_batches_being_sent_and_sends_nothing_more():
    started = []

    async def send(batch):
        started.append(len(batch))
        try:
            await asyncio.sleep(60)
        finally:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(RuntimeError("cancelled"))

    async def go():
        c = Coalescer(send, max_batch=2, linger_s=0.01)
        sending = [c.add(i) for i in range(2)]
        waiting = c.add(2)
        await asyncio.sleep(0)
        await c.cancel()
        await asyncio.sleep(0.03)
        assert started == [2] and not c.tasks
        assert all(isinstance(f.exception(), RuntimeError) for f in sending) and not waiting.done()

    asyncio.run(go())
