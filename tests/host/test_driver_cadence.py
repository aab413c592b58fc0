"""The engine driver's cadence (pure logic, a stand-in engine that only records how it is called):
polls are short, so a submit queued while requests run reaches the engine within one slice rather
than at the next result, and token-only progress reaches the event loop at a bounded rate, not once
per poll."""
from __future__ import annotations

import asyncio
import threading
import time

from forge.engines.interface import EngineRequest, IterationStats, Progress
from forge.host.driver import COMMAND_LATENCY_S, PROGRESS_EVERY_S, EngineDriver, Progressed


class RecordingEngine:
    """Runs nothing: every poll waits its timeout and reports one new token; submits are
    timestamped."""

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
        events: list = []
        driver.start(asyncio.get_running_loop(), events.extend)
        driver.submit([EngineRequest("first", [1, 2, 3], 4)])  # the engine is busy from now on
        await asyncio.sleep(0.1)
        driver.submit([EngineRequest("refill", [1, 2, 3], 4)])
        await asyncio.sleep(0.4)
        driver.stop()
        await asyncio.to_thread(driver.join, 2.0)
        return eng, events

    eng, events = asyncio.run(main())
    # every poll is one slice at most: the refill waited for no result (the old driver polled for 50
    # ms)
    assert (
        "refill" in eng.submitted_at
        and eng.poll_timeouts
        and max(eng.poll_timeouts) <= COMMAND_LATENCY_S
    )
    progress = [e.progress for e in events if type(e) is Progressed]
    assert progress and sum(p.new_tokens for p in progress) <= len(eng.poll_timeouts)
    assert len(progress) <= 0.5 / PROGRESS_EVERY_S + 2 < len(eng.poll_timeouts)


class FinishingEngine(RecordingEngine):
    """Each poll finishes one of the requests it holds (a result) after 2 ms."""

    def __init__(self):
        super().__init__()
        self.held: list = []

    def submit(self, requests):
        super().submit(requests)
        self.held += [r.request_id for r in requests]

    def poll(self, timeout_s):
        from forge.engines.interface import EngineResult

        time.sleep(0.002)
        if not self.held:
            return Progress()
        return Progress(results=[EngineResult(self.held.pop(0), [7], "length")], new_tokens=1)


def result_batches(hold_results_above, n: int) -> list[int]:
    async def main():
        eng = FinishingEngine()
        driver = EngineDriver(eng, name="t", poll_timeout_s=0.05, inbox_size=64, outbox_size=256,
                              hold_results_above=hold_results_above)
        batches: list[int] = []

        def on_events(events):
            batches.extend(
                len(e.progress.results)
                for e in events
                if type(e) is Progressed and e.progress.results
            )

        driver.start(asyncio.get_running_loop(), on_events)
        driver.submit([EngineRequest(f"r{i}", [1, 2, 3], 4) for i in range(n)])
        deadline = time.monotonic() + 30
        while sum(batches) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        driver.stop()
        await asyncio.to_thread(driver.join, 2.0)
        return batches

    return asyncio.run(main())


def test_results_are_held_while_the_engine_has_a_queue_of_its_own_and_go_at_once_when_it_has_not():
    slots, n = 4, 40
    assert result_batches(None, n) == [1] * n  # the control: every result on its own
    held = result_batches(slots, n)
    assert sum(held) == n                      # every result, once
    assert len(held) <= 0.6 * n, held          # held while the engine had a queue to draw on
    assert held[-slots:] == [1] * slots, held  # down to its slots: each result at once
