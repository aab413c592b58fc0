"""The asyncio Broker: back-pressure, bounded waits, close, and wake-ups."""
from __future__ import annotations

import asyncio

import pytest

from forge.broker import Broker, BrokerClosed, BrokerCore, NoEngineFits, QueueFull

from .helpers import geom, req


def broker(max_pending: int = 2, **kw) -> Broker:
    return Broker(BrokerCore([geom("e0", **kw)], max_pending=max_pending))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5.0))


def test_put_waits_while_full_and_resumes_after_a_take():
    async def main():
        b = broker(max_pending=2)
        await b.put(req(range(10)))
        await b.put(req(range(10)))
        third = asyncio.create_task(b.put(req(range(10))))
        await asyncio.sleep(0.05)
        assert not third.done() and b.pending() == 2            # back-pressure
        got = await b.take("e0", free_slots=1, free_kv_blocks=100, timeout_s=1)
        assert len(got) == 1
        await asyncio.wait_for(third, 1)                       # room freed: the producer goes on
        assert b.pending() == 2
    run(main())


def test_put_with_timeout_raises_queue_full_and_put_nowait_raises_at_once():
    async def main():
        b = broker(max_pending=1)
        b.put_nowait(req(range(10)))
        with pytest.raises(QueueFull):
            b.put_nowait(req(range(10)))
        with pytest.raises(QueueFull):
            await b.put(req(range(10)), timeout_s=0.05)
        assert isinstance(QueueFull(), asyncio.QueueFull)
    run(main())


def test_no_engine_fits_is_raised_at_once_even_when_full():
    async def main():
        b = broker(max_pending=1, max_in=20)
        b.put_nowait(req(range(5)))
        with pytest.raises(NoEngineFits):
            await b.put(req(range(50)))
        assert b.stats().no_fit == 1
    run(main())


def test_no_engine_fits_with_room_is_raised_once_and_counted_once():
    async def main():
        b = broker(max_pending=4, max_in=20)
        with pytest.raises(NoEngineFits):
            await b.put(req(range(50)))
        with pytest.raises(NoEngineFits):
            b.put_nowait(req(range(50)))
        assert b.stats().no_fit == 2 and b.pending() == 0
    run(main())


def test_on_done_many_keeps_the_books_as_on_done():
    async def main():
        b = Broker(BrokerCore([geom("e0", slots=2)], max_pending=8))
        rs = [req(range(10)) for _ in range(4)]
        for r in rs:
            await b.put(r)
        got = await b.take("e0", free_slots=2, free_kv_blocks=100, timeout_s=1)
        assert len(got) == 2 and b.core.in_flight() == 2
        loads = b.core.loads()["e0"]
        assert loads["outstanding_requests"] == 2 and loads["outstanding_work"] > 0
        b.on_done_many("e0", got + got + [rs[3]])     # repeats and a request not in flight: no-ops
        assert b.core.in_flight() == 0 and b.pending() == 2
        loads = b.core.loads()["e0"]
        assert loads["outstanding_requests"] == 0 and loads["outstanding_work"] == 0
        assert len(await b.take("e0", free_slots=2, free_kv_blocks=100, timeout_s=1)) == 2
        with pytest.raises(ValueError, match="unknown engine"):
            b.on_done_many("nope", [])
    run(main())


def test_take_times_out_with_an_empty_batch_and_wakes_on_put():
    async def main():
        b = broker()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await b.take("e0", free_slots=4, free_kv_blocks=100, timeout_s=0.05) == []
        assert loop.time() - t0 >= 0.04
        waiter = asyncio.create_task(b.take("e0", free_slots=4, free_kv_blocks=100, timeout_s=2))
        await asyncio.sleep(0.02)
        r = req(range(10))
        await b.put(r)
        assert await asyncio.wait_for(waiter, 1) == [r]
    run(main())


def test_close_wakes_waiters_refuses_puts_and_drains_pending():
    async def main():
        b = broker(max_pending=1)
        r = req(range(10))
        await b.put(r)
        blocked_put = asyncio.create_task(b.put(req(range(10))))
        idle = Broker(BrokerCore([geom("e0")]))
        blocked_take = asyncio.create_task(
            idle.take("e0", free_slots=1, free_kv_blocks=100, timeout_s=5)
        )
        await asyncio.sleep(0.02)
        b.close()
        idle.close()
        with pytest.raises(BrokerClosed):
            await asyncio.wait_for(blocked_put, 1)
        with pytest.raises(BrokerClosed):
            await asyncio.wait_for(blocked_take, 1)
        with pytest.raises(BrokerClosed):
            b.put_nowait(req(range(3)))
        # what was pending before close is still handed out; then the broker says it is closed
        assert await b.take("e0", free_slots=1, free_kv_blocks=100, timeout_s=0.1) == [r]
        b.requeue([r])                                          # requeue after close still works
        assert await b.take("e0", free_slots=1, free_kv_blocks=100, timeout_s=0.1) == [r]
        with pytest.raises(BrokerClosed):
            await b.take("e0", free_slots=1, free_kv_blocks=100, timeout_s=0.1)
    run(main())


def test_notify_and_on_done_wake_a_waiting_taker():
    async def main():
        b = Broker(BrokerCore([geom("e0", kv=8, tpb=16)]))
        first, second = req(range(100)), req(range(100))     # 7 blocks each: one at a time
        await b.put(first)
        await b.put(second)
        assert await b.take("e0", free_slots=2, free_kv_blocks=8, timeout_s=0.1) == [first]
        waiter = asyncio.create_task(b.take("e0", free_slots=2, free_kv_blocks=8, timeout_s=2))
        await asyncio.sleep(0.02)
        b.on_done("e0", first)
        assert await asyncio.wait_for(waiter, 1) == [second]
        waiter = asyncio.create_task(b.take("e0", free_slots=1, free_kv_blocks=8, timeout_s=2))
        await asyncio.sleep(0.02)
        b.notify()
        await asyncio.sleep(0.02)
        assert not waiter.done()                               # woken, nothing there, waits again
        waiter.cancel()
    run(main())


def test_many_producers_one_consumer_nothing_lost():
    async def main():
        b = broker(max_pending=8, slots=4)
        sent = [req(range(k % 50 + 1)) for k in range(400)]

        async def produce(chunk):
            for r in chunk:
                await b.put(r)

        producers = [asyncio.create_task(produce(sent[k::4])) for k in range(4)]
        got = []
        while len(got) < len(sent):
            batch = await b.take("e0", free_slots=4, free_kv_blocks=4096, timeout_s=1)
            got += batch
            for r in batch:
                b.on_done("e0", r)
        await asyncio.gather(*producers)
        assert sorted(r.request_id for r in got) == sorted(r.request_id for r in sent)
        assert b.pending() == 0 and b.stats().dispatched == 400
    run(main())
