"""How many records a job keeps started and unfinished: about what the cards finish in HORIZON_S.

Every record started is marked started in the ledger and holds its function's work so far in memory:
a kill loses all of it, and with --concurrency's 1,024 records started at once each record's next
call waits behind a thousand others. By Little's law, records in flight = the rate they finish x the
time each spends in flight; holding them to (the finish rate measured over the last WINDOW_S) x
HORIZON_S keeps each record's time in flight near HORIZON_S once the cards are busy, and lets the
pool grow (by that same rule) while they are not.

Never below FLOOR_PER_SLOT x the slots of the node's cards, so the cards never wait on this gate: a
record alternates between a call on a card and its function's own code between calls, each card's
link keeps the next batch waiting in its host (credit over the slots), a vLLM card holds a queue as
long as its slots, and the broker needs a pool to group by prefix and serve longer outputs first
(docs/broker.md); on a 256-slot card that is 1,024, the default --concurrency. Before the node
reports its cards, UNKNOWN_FLOOR. Never above the ceiling (--concurrency). Pure bookkeeping on the
job's loop: `enter` waits (no timeout of its own: it waits on records the runner bounds), `leave`
and `adjust` never block."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional

HORIZON_S = 5.0         # records in flight: what the cards finish in about this long
WINDOW_S = 5.0          # the finish rate: records settled over this trailing window
FLOOR_PER_SLOT = 4      # never fewer records in flight than this many per card slot
UNKNOWN_FLOOR = 128     # the floor until the node reports its cards' slots
_SAMPLES_MAX = 256      # rate samples kept (adjust runs every tick; WINDOW_S of them are needed)


class RecordPace:
    def __init__(self, ceiling: int):
        if ceiling < 1:
            raise ValueError(f"ceiling must be >= 1, got {ceiling}")
        self.ceiling = ceiling
        self.floor = min(UNKNOWN_FLOOR, ceiling)
        self.limit = self.floor
        self.open = 0                       # records entered and not yet left
        # (monotonic time, settled)
        self._samples: deque[tuple[float, int]] = deque(maxlen=_SAMPLES_MAX)
        self._waiters: deque[asyncio.Future] = deque()
        self._unbounded = False

    async def enter(self) -> None:
        """Wait until one more record may start, and count it started."""
        while not self._unbounded and self.open >= self.limit:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake()  # it was woken for a place it will not take: hand that on
                raise
        self.open += 1

    def leave(self) -> None:
        self.open -= 1
        self._wake()

    def unbound(self) -> None:
        """Let every waiter through now (the job is stopping: they find nothing more to start)."""
        self._unbounded = True
        self._wake()

    def adjust(self, now: float, settled: int, slots: Optional[int]) -> int:
        """Set the limit from the records settled so far (a count that only grows) and the cards'
        slots (None: not reported yet); returns it."""
        if slots:
            self.floor = min(max(FLOOR_PER_SLOT * slots, 1), self.ceiling)
        self._samples.append((now, settled))
        while len(self._samples) > 2 and self._samples[1][0] <= now - WINDOW_S:
            self._samples.popleft()
        t0, n0 = self._samples[0]
        rate = (settled - n0) / (now - t0) if now - t0 >= min(1.0, WINDOW_S) else 0.0
        self.limit = max(self.floor, min(self.ceiling, int(rate * HORIZON_S)))
        self._wake()
        return self.limit

    def _wake(self) -> None:
        room = len(self._waiters) if self._unbounded else self.limit - self.open
        while room > 0 and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                room -= 1
