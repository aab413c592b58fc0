"""Stalls, wedged engines and crashes: work is taken back, given back to its link and finished
(elsewhere, when the node has another card), never lost. One card: its LinkSessions fed as a link
feeds it; several: the node's broker and links (_admission_harness.py)."""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.host._admission_harness import (
    Harness,
    LinkedCards,
    contract,
    faulty,
    instant,
    plan,
    until,
)

pytestmark = pytest.mark.timeout(30)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_a_frozen_engine_that_recovers_finishes_everything():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, rate=4000, freeze_after_requests=3, freeze_for_s=1.0), p,
                     stall_window_s=0.2, takeback_interval_s=0.05)
        ids = h.put(12)
        states = set()
        end = time.monotonic() + 10
        while not all(i in h.results for i in ids):
            states.add(rt.state)
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        h.assert_exactly_once(ids)
        s = rt.stats()
        assert "stalled" in states and s.stalls >= 1 and s.progress_only_steps >= 1
        assert s.requests_requeued >= 1                    # the youngest were taken back...
        assert s.requests_ok == 12 and s.healthy          # ...and finished after the recovery
        assert all(r.finish_reason == "length" for [(_, r)] in h.results.values())
        assert rt.state == "running"
        await h.stop()

    run(go())


def test_stall_takes_back_the_youngest_first_and_pauses_admission():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, rate=4000, freeze_after_requests=0), p, stall_window_s=0.3,
                     takeback_interval_s=0.3)
        h.put(8)
        await until(lambda: len(rt._table.running()) == 4)
        admitted = sorted(rt._table.live.values(), key=lambda f: f.seq)
        await until(lambda: rt.state == "stalled")  # one window: paused, nothing taken back yet
        assert rt.stats().stalls == 1 and len(rt._table.live) == 4 and h.pending() == 4
        await until(lambda: len(rt._table.live) == 3)      # a second window: the youngest went back
        assert admitted[-1].key not in rt._table.live and admitted[0].key in rt._table.live
        assert h.pending() == 5                            # paused: nothing new was taken
        await until(lambda: rt.state == "wedged")          # all taken back, still silent
        assert not rt._table.live and not rt.stats().healthy
        assert [f.key for f in admitted][::-1] == list(rt._table.orphans)   # youngest first
        assert h.results == {} and h.pending() == 8 and rt.stats().in_flight == 4
        assert h.feed.queue.pending() == 0  # unhealthy: what was queued went back to the link too
        await h.stop()

    run(go())


def test_work_on_a_frozen_engine_moves_to_a_healthy_one():
    a = contract(
        name="a",
        backend="faults",
        slots=4,
        sections={
            "faults": {"wraps": "instant", "freeze_after_requests": 2},
            "instant": {"tokens_per_s_limit": 3000.0},
        },
    )
    b = contract(name="b", slots=4, sections={"instant": {"tokens_per_s_limit": 3000.0}})
    pa, pb = plan(a, 0), plan(b, 1)

    async def go():
        # take-backs every 0.02 s (a tenth of the window)
        h = LinkedCards([pa, pb], stall_window_s=0.2)
        await h.start()
        ra, rb = h.runtime(0), h.runtime(1)
        ids = h.put(40)
        await h.wait_all(ids, 15)
        h.assert_exactly_once(ids)
        assert all(r[2] == "length" for [(_, r)] in h.results.values())
        assert h.by_card().count("cpu0") == 2             # exactly what the frozen engine gave out
        assert ra.stats().stalls == 1 and ra.stats().requests_requeued >= 1
        for _ in range(200):                              # all taken back and still silent: wedged
            if ra.state == "wedged":
                break
            await asyncio.sleep(0.01)
        assert ra.state == "wedged" and not ra.stats().healthy and rb.stats().healthy
        await h.stop()

    run(go())


def test_a_crash_requeues_in_flight_work_to_the_other_engine():
    a = contract(
        name="a",
        backend="faults",
        slots=4,
        sections={
            "faults": {"wraps": "instant", "crash_after_requests": 5},
            "instant": {"tokens_per_s_limit": 3000.0},
        },
    )
    b = contract(name="b", slots=4, sections={"instant": {"tokens_per_s_limit": 3000.0}})
    pa, pb = plan(a, 0), plan(b, 1)

    async def go():
        h = LinkedCards([pa, pb], stall_window_s=2.0)
        await h.start()
        ra, rb = h.runtime(0), h.runtime(1)
        ids = h.put(40)
        await h.wait_all(ids, 15)
        h.assert_exactly_once(ids)
        assert all(r[2] == "length" for [(_, r)] in h.results.values())
        assert h.by_card().count("cpu0") == 5
        await asyncio.wait_for(h.admission_task(0), 5)     # run() of the crashed card returned
        s = ra.stats()
        assert ra.state == "failed" and not s.healthy and "injected crash" in ra.failure
        assert s.requests_requeued >= 1 and s.in_flight == 0
        assert not ra._driver.alive()
        # the other engine took everything else, requeued work included, and is still healthy
        assert h.by_card().count("cpu1") == 35
        assert rb.state != "failed" and rb.stats().healthy
        await h.stop()

    run(go())


def test_a_crash_with_no_other_engine_leaves_the_work_with_the_link():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, rate=3000, crash_after_requests=2), p, stall_window_s=2.0)
        ids = h.put(10)
        await asyncio.wait_for(h.tasks[0], 10)
        assert rt.state == "failed" and not rt.stats().healthy
        assert len(h.results) == 2 and len(h.results) + h.pending() == len(ids)
        await h.stop()

    run(go())


def test_an_engine_call_that_never_returns_is_a_dead_engine():
    c = contract(slots=4)
    p = plan(c)
    eng = instant(c, p)
    release = __import__("threading").Event()
    real_poll = eng.poll

    def hung_poll(timeout_s):
        release.wait(30)  # breaks the interface's promise on purpose
        return real_poll(timeout_s)

    eng.poll = hung_poll

    async def go():
        h = Harness(p)
        rt = h.start(eng, p, stall_window_s=0.3, poll_timeout_s=0.01)
        ids = h.put(3)
        await asyncio.wait_for(h.tasks[0], 5)
        assert rt.state == "failed" and "has not returned" in rt.failure
        assert h.pending() == len(ids) and h.results == {}
        release.set()
        await h.stop()  # the thread, released, shuts the engine down

    run(go())


def test_an_unexpected_exception_from_the_engine_is_a_crash_too():
    c = contract(slots=4)
    p = plan(c)
    eng = instant(c, p, rate=500)

    def broken_poll(timeout_s):
        raise RuntimeError("device lost")

    eng.poll = broken_poll

    async def go():
        h = Harness(p)
        rt = h.start(eng, p, stall_window_s=2.0)
        ids = h.put(6)
        await asyncio.wait_for(h.tasks[0], 5)
        assert rt.state == "failed" and "RuntimeError: device lost" in rt.failure
        assert h.results == {} and h.pending() == len(ids)
        assert rt.stats().requests_requeued == 4 and rt.stats().in_flight == 0
        await h.stop()

    run(go())
