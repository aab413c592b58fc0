"""The engine driver's cadence (pure logic, a stand-in engine that only records how it is called): polls are
short, so a submit queued while requests run reaches the engine within one slice rather than at the next
result, and token-only progress reaches the event loop at a bounded rate, not once per poll."""
from __future__ import annotations

import asyncio
import threading
import time

from forge.engines.interface import EngineRequest, IterationStats, Progress
from forge.host.driver import COMMAND_LATENCY_S, PROGRESS_EVERY_S, EngineDriver


class RecordingEngine:
    """Runs nothing: every poll waits its timeout and reports one new token; submits are timestamped."""

    def __init__(self):
        self.poll_timeouts: list[float] = []
        self.submitted_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def submit(self, requests):
        with self.lock:
            for r in requests:
                self.submitted_at[r.request_id] = time.monotonic()

    def poll(self, timeout_s):
        self.poll_timeouts.append(timeout_s)
        time.sleep(timeout_s)
        return Progress(new_tokens=1)

    def cancel(self, request_id):
        pass

    def stats(self):
        return IterationStats()

    def shutdown(self, timeout_s):
        pass


def test_polls_are_short_so_a_refill_reaches_a_busy_engine_at_once_and_progress_is_batched():
    async def main():
        eng = RecordingEngine()
        driver = EngineDriver(eng, name="t", poll_timeout_s=0.05, inbox_size=8, outbox_size=64)
        events: list[tuple] = []
        driver.start(asyncio.get_running_loop(), events.extend)
        driver.submit([EngineRequest("first", [1, 2, 3], 4)])        # the engine is busy from now on
        await asyncio.sleep(0.1)
        driver.submit([EngineRequest("refill", [1, 2, 3], 4)])
        await asyncio.sleep(0.4)
        driver.stop()
        await asyncio.to_thread(driver.join, 2.0)
        return eng, events

    eng, events = asyncio.run(main())
    # every poll is one slice at most: the refill waited for no result (the old driver polled for 50 ms)
    assert "refill" in eng.submitted_at and eng.poll_timeouts and max(eng.poll_timeouts) <= COMMAND_LATENCY_S
    progress = [v for k, v in events if k == "progress"]
    assert progress and sum(p.new_tokens for p in progress) <= len(eng.poll_timeouts)
    assert len(progress) <= 0.5 / PROGRESS_EVERY_S + 2 < len(eng.poll_timeouts)
