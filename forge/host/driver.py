"""The engine's driver thread: the only thread that calls into an Engine.

The event loop never calls the engine (a slow or hung engine call would freeze every card). It puts
commands on a bounded inbox; this thread submits, cancels and polls with a timeout, and hands events
back through a bounded outbox, waking the loop with call_soon_threadsafe. Commands are Submit and
Cancel; events are the NamedTuples below (the loop tells them apart by type):

    Submitted(keys)              the engine accepted the requests with these keys
    Busy(keys)                   the engine refused them (EngineBusy); the loop decides about retries
    Progressed(progress)         results and new tokens since the last Progressed (a Progress)
    Partials(partials)           streamed requests' output so far (Progress.partials), as it grows
    Sampled(stats)               a periodic snapshot of the engine (IterationStats)
    Failed(message)              the engine raised EngineFailed or anything unexpected; the thread ends

`busy_in_engine_since` is when the thread entered its current engine call (None between calls), so
the loop can tell an engine call that broke its timeout from an engine that is merely slow (see
trouble())."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Callable, Hashable, NamedTuple, Optional, Sequence, Union

from forge import constants
from forge.engines.interface import (
    Engine,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    IterationStats,
    Progress,
)
from forge.host.protocol import STATS_INTERVAL_S

log = logging.getLogger("forge.host.driver")

# a poll lasts at most this long, so a submit waits at most this for the engine
COMMAND_LATENCY_S = 0.005
# token progress without results reaches the loop this often (liveness only)
PROGRESS_EVERY_S = 0.05
# An engine holding requests in a queue of its own beyond its slots (Engine.queues_beyond_slots)
# needs no refill while that queue is not empty: its results are held up to this long and handed
# over together, so the event loop, which shares the engine's interpreter lock and its core, wakes
# once a batch, not once a step (docs/benchmarks.md, "vLLM on the CPU"); once the engine holds no
# more than its slots, results go at once.
HOLD_RESULTS_S = 0.03
OUTBOX_PUT_SLICE_S = 0.05       # a full outbox is retried in slices, checking for stop between


class Submit(NamedTuple):
    requests: list[EngineRequest]


class Cancel(NamedTuple):
    key: Hashable


class Submitted(NamedTuple):
    keys: list[Hashable]


class Busy(NamedTuple):
    keys: list[Hashable]


class Progressed(NamedTuple):
    progress: Progress


class Partials(NamedTuple):
    partials: list[tuple[Hashable, list[int]]]


class Sampled(NamedTuple):
    stats: IterationStats


class Failed(NamedTuple):
    message: str


DriverEvent = Union[Submitted, Busy, Progressed, Partials, Sampled, Failed]


class EngineDriver:
    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        poll_timeout_s: float,
        inbox_size: int,
        outbox_size: int,
        shutdown_timeout_s: float = constants.ENGINE_SHUTDOWN_TIMEOUT_S,
        hold_results_above: Optional[int] = None,
    ):
        """hold_results_above: the engine's slots where it queues requests beyond them
        (HOLD_RESULTS_S); None hands every result over at once."""
        self.engine = engine
        self.hold_results_above = hold_results_above
        self.poll_timeout_s = poll_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._inbox: queue.Queue = queue.Queue(maxsize=inbox_size)
        self._outbox: queue.Queue = queue.Queue(maxsize=outbox_size)
        self._stop = threading.Event()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._on_events: Optional[Callable[[list[DriverEvent]], None]] = None
        self._active = 0                    # requests the engine holds, as far as this thread knows
        self.busy_in_engine_since: Optional[float] = None   # set while inside an engine call
        self._thread = threading.Thread(target=self._main, name=f"forge-engine-{name}", daemon=True)

    # ------------------------------------------------------------------ loop side
    def start(
        self, loop: asyncio.AbstractEventLoop, on_events: Callable[[list[DriverEvent]], None]
    ) -> None:
        self._loop, self._on_events = loop, on_events
        self._thread.start()

    def submit(self, requests: Sequence[EngineRequest]) -> bool:
        """Queue a submit; False when the inbox is full (the caller treats it as a refusal)."""
        return self._offer(Submit(list(requests)))

    def cancel(self, key: Hashable) -> bool:
        return self._offer(Cancel(key))

    def stop(self) -> None:
        """Ask the thread to leave its loop and shut the engine down (it does so within one
        poll)."""
        self._stop.set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def trouble(self, now: float, limit_s: float) -> Optional[str]:
        """Why the engine must be given up on, seen from the loop: the thread died, or one engine
        call has run longer than `limit_s` (the interface promises every call returns within its
        timeout)."""
        if not self._thread.is_alive():
            self.flush()                # its last word (Failed) reaches the loop first
            return "engine driver thread died"
        inside = self.busy_in_engine_since
        if inside is not None and now - inside > limit_s:
            return (f"an engine call has not returned for {now - inside:.1f} s "
                    "(every call must return within its timeout)")
        return None

    def _offer(self, cmd: Submit | Cancel) -> bool:
        try:
            self._inbox.put_nowait(cmd)
            return True
        except queue.Full:
            return False

    def flush(self) -> None:
        """Hand every queued event to the loop now (used when the thread is gone)."""
        self._drain_outbox()

    def _drain_outbox(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        events = []
        while True:
            try:
                events.append(self._outbox.get_nowait())
            except queue.Empty:
                break
        if events and self._on_events is not None:
            self._on_events(events)

    # ------------------------------------------------------------------ thread side
    def _emit(self, event: DriverEvent) -> bool:
        while True:
            try:
                self._outbox.put(event, timeout=OUTBOX_PUT_SLICE_S)
                break
            # the loop is behind: wait for it (bounded slices), unless told to stop
            except queue.Full:
                if self._stop.is_set():
                    return False
        with self._wake_lock:
            if self._wake_pending:
                return True
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._drain_outbox)
        except RuntimeError:        # the loop is closed: nobody is listening any more
            self._stop.set()
            return False
        return True

    def _call(self, fn, *args):
        self.busy_in_engine_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.busy_in_engine_since = None

    def _handle(self, cmd: Submit | Cancel) -> None:
        if type(cmd) is Submit:
            reqs = cmd.requests
            try:
                self._call(self.engine.submit, reqs)
            except EngineBusy:
                self._emit(Busy([r.request_id for r in reqs]))
                return
            self._active += len(reqs)
            self._emit(Submitted([r.request_id for r in reqs]))
        else:
            self._call(self.engine.cancel, cmd.key)

    def _hand_over(self, held: list) -> None:
        if held:
            self._emit(Progressed(Progress(results=held)))

    def _main(self) -> None:
        last_stats = last_progress = 0.0
        tokens = 0                          # progress polled and not yet handed to the loop
        held: list = []                     # results polled and not yet handed to the loop
        slice_s = min(self.poll_timeout_s, COMMAND_LATENCY_S)
        try:
            while not self._stop.is_set():
                try:
                    while True:
                        self._handle(self._inbox.get_nowait())
                except queue.Empty:
                    pass
                if self._active <= 0:
                    # Nothing in the engine: wait for a command instead of polling an idle engine.
                    try:
                        self._handle(self._inbox.get(timeout=self.poll_timeout_s))
                    except queue.Empty:
                        pass
                else:
                    # Short polls: a submit the loop queued meanwhile (a freed slot's refill)
                    # reaches the engine within one slice, not at the next result; results go out as
                    # soon as they come, or within HOLD_RESULTS_S while the engine still has a queue
                    # of its own to draw on.
                    progress = self._call(self.engine.poll, slice_s)
                    if progress.partials:  # streamed requests only: their text goes out as it grows
                        self._emit(Partials(progress.partials))
                    tokens += progress.new_tokens
                    self._active -= len(progress.results)
                    held += progress.results
                    now = time.monotonic()
                    if (
                        held
                        and (
                            self.hold_results_above is None
                            or self._active <= self.hold_results_above
                            or now - last_progress >= HOLD_RESULTS_S
                        )
                        or tokens
                        and now - last_progress >= PROGRESS_EVERY_S
                    ):
                        progress.results, held = held, []
                        progress.new_tokens, tokens = tokens, 0
                        last_progress = now
                        self._emit(Progressed(progress))
                now = time.monotonic()
                if now - last_stats >= STATS_INTERVAL_S:
                    last_stats = now
                    self._emit(Sampled(self._call(self.engine.stats)))
            self._hand_over(held)  # told to stop: what the engine finished still reaches the loop
        except EngineFailed as e:
            self._hand_over(held)           # results the engine gave before it failed are results
            self._emit(Failed(f"engine failed: {e}"))
        except BaseException as e:  # noqa: BLE001 - any escape from an engine call is a dead engine
            log.exception("engine driver %s crashed", self._thread.name)
            self._hand_over(held)
            self._emit(Failed(f"engine driver crashed: {type(e).__name__}: {e}"))
        finally:
            try:
                self.engine.shutdown(self.shutdown_timeout_s)
            except Exception as e:  # noqa: BLE001 - shutting down a broken engine may fail too
                log.warning(
                    "engine %s shutdown raised %s: %s", self._thread.name, type(e).__name__, e
                )
