"""The job's pace (forge/functions/pace.py): records in flight follow the rate they finish x
HORIZON_S, within the cards' floor and --concurrency; a record waits at the gate while the limit is
reached, and every waiter goes on once the job stops. Pure logic on a clock the test passes in."""
from __future__ import annotations

import asyncio

import pytest

from forge.functions.pace import FLOOR_PER_SLOT, HORIZON_S, UNKNOWN_FLOOR, WINDOW_S, RecordPace


def test_the_limit_is_the_floor_until_records_finish_then_the_rate_times_the_horizon():
    pace = RecordPace(1024)
    assert pace.limit == UNKNOWN_FLOOR  # the node has not reported its cards yet
    assert pace.adjust(0.0, 0, slots=32) == FLOOR_PER_SLOT * 32
    # under a second of samples: no rate yet
    assert pace.adjust(0.5, 10, slots=32) == FLOOR_PER_SLOT * 32
    # 100 records a second: what the cards finish in HORIZON_S
    for t in range(1, 11):
        limit = pace.adjust(float(t), 100 * t, slots=32)
    assert limit == int(100 * HORIZON_S)
    # the rate halves: the window forgets the faster past within WINDOW_S
    settled = 1000
    for t in range(11, 11 + int(WINDOW_S) + 2):
        settled += 50
        limit = pace.adjust(float(t), settled, slots=32)
    assert limit == int(50 * HORIZON_S)


def test_the_limit_stays_within_the_cards_floor_and_the_ceiling():
    pace = RecordPace(100)
    pace.adjust(0.0, 0, slots=8)
    assert pace.adjust(5.0, 5, slots=8) == FLOOR_PER_SLOT * 8  # 1 record/s x 5 s is below the floor
    assert pace.adjust(6.0, 10_000, slots=8) == 100            # fast: capped at --concurrency
    small = RecordPace(4)
    assert small.adjust(0.0, 0, slots=32) == 4  # --concurrency below the floor wins


def test_a_record_waits_at_the_limit_and_starts_when_one_leaves():
    async def main():
        pace = RecordPace(2)
        pace.adjust(0.0, 0, slots=1)                        # floor 2, ceiling 2
        await pace.enter()
        await pace.enter()
        third = asyncio.create_task(pace.enter())
        await asyncio.sleep(0)
        assert not third.done() and pace.open == 2
        pace.leave()
        await asyncio.wait_for(third, 1.0)
        assert pace.open == 2

    asyncio.run(main())


def test_a_stopping_job_lets_every_waiter_through_and_a_cancelled_waiter_passes_its_turn_on():
    async def main():
        pace = RecordPace(1)
        await pace.enter()
        waiters = [asyncio.create_task(pace.enter()) for _ in range(3)]
        await asyncio.sleep(0)
        pace.leave()                                        # wakes the first waiter...
        waiters[0].cancel()                                 # ...which is cancelled before it runs
        await asyncio.gather(waiters[0], return_exceptions=True)
        await asyncio.wait_for(waiters[1], 1.0)             # the place went to the next one
        assert not waiters[2].done()
        pace.unbound()
        await asyncio.wait_for(waiters[2], 1.0)

    asyncio.run(main())


def test_the_ceiling_must_be_positive():
    with pytest.raises(ValueError, match="ceiling"):
        RecordPace(0)
