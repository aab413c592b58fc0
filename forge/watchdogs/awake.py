"""Time this process spent not running (SIGSTOP, Ctrl-Z, a suspended VM), seen as gaps in a
heartbeat on its event loop.

Timeouts and watchdogs measure waits with time.monotonic, which keeps counting while the process is
stopped. Woken after 30 s, every wait that was open looks 30 s old, and a peer that answered at once
(an engine whose call was cut short by the stop, a worker whose reply sits in the socket) would be
condemned for this process's own absence. A wait measured with `PauseClock.awake_since` leaves out
the stretches in which this process's loop did not run: a peer is judged only on the time this
process was there to see it answer.

A heartbeat callback runs every BEAT_S; one that comes more than GAP_S late marks a pause
(scheduling noise and short loop stalls stay counted as time). A pause not yet seen by the heartbeat
(asked about in the first callbacks after waking) is counted from the heartbeat's lateness, so the
order in which woken timers run does not matter. A loop blocked by its own work for GAP_S or more
counts as paused too: nothing on it could have watched a peer meanwhile."""
from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from typing import Optional

BEAT_S = 0.25
GAP_S = 1.0
KEEP = 64                  # pauses remembered; older ones lie before any wait still open


class PauseClock:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        # (start, end) in time.monotonic
        self._pauses: deque[tuple[float, float]] = deque(maxlen=KEEP)
        self._last = time.monotonic()
        self._handle = loop.call_later(BEAT_S, self._beat)

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last - BEAT_S > GAP_S:
            self._pauses.append((self._last + BEAT_S, now))
        self._last = now
        self._handle = self._loop.call_later(BEAT_S, self._beat)

    def paused_since(self, since: float, now: Optional[float] = None) -> float:
        """Seconds of [since, now] in which this process's loop did not run."""
        now = time.monotonic() if now is None else now
        total = sum(
            max(0.0, min(end, now) - max(start, since))
            for start, end in self._pauses
            if end > since
        )
        if now - self._last - BEAT_S > GAP_S:          # waking now: the heartbeat has not run yet
            total += max(0.0, now - max(self._last + BEAT_S, since))
        return total

    def awake_since(self, since: float, now: Optional[float] = None) -> float:
        """Seconds since `since` that this process was running (time.monotonic less the pauses)."""
        now = time.monotonic() if now is None else now
        return max(0.0, now - since - self.paused_since(since, now))

    def close(self) -> None:
        self._handle.cancel()


_clocks: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PauseClock]" = (
    weakref.WeakKeyDictionary()
)


def pause_clock(loop: Optional[asyncio.AbstractEventLoop] = None) -> PauseClock:
    """The pause clock of `loop` (default: the running loop), started on first use."""
    loop = loop or asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = PauseClock(loop)
    return clock
