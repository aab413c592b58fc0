"""A watchdog beside the event loop of `forge run`: signals answered, and a blocked loop named,
whatever a function does.

A function that blocks the loop in synchronous code (`time.sleep(120)`, a CPU-bound loop, a blocking
socket) stops everything on it: the other records, the node's links, and asyncio's signal handlers,
which run as loop callbacks. So the signals are not read on the loop: Python's C-level handler
writes each signal's number to a socket (`signal.set_wakeup_fd`) whatever the main thread is doing,
and a thread reads it:

- the loop is answering (its heartbeat is recent): the signal is handed to the loop, as asyncio
  would;
- the loop has not answered a signal within ANSWER_S: the first gets one line naming the code that
  holds the loop; a second stops the process at once (`os._exit`, like `kill -9` to the ledger:
  every committed row stays, the rest is pending, and the same command resumes).

The same thread names a loop blocked for REPORT_S or more in one line, once per stall: the innermost
frame of the loop thread outside forge and the libraries (the function's own line), else the
innermost frame."""
from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import sys
import sysconfig
import threading
import time
from typing import Callable, Optional

from forge.errors import display_path

BEAT_S = 0.1            # the loop's heartbeat
ANSWER_S = 0.5          # a signal the loop has not taken this long is answered from the watchdog
REPORT_S = 2.0          # a loop blocked this long is named
# the watchdog itself did not run this long: the whole process was stopped, not its loop
STOPPED_S = 1.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}

# forge itself
_LIBRARY_DIRS = tuple(
    {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
        *(
            os.path.abspath(p) + os.sep
            for p in (
                sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")
            )
            if p
        ),
    }
)


def _say(line: str) -> None:
    """One line on stderr without Python's buffered writer (which the blocked thread may hold)."""
    try:
        os.write(2, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def where(frame) -> tuple[str, bool]:
    """('function (file:line)', True) for the innermost frame outside forge and the libraries (a
    user's code), else ('function (file:line)' of the innermost frame, False)."""
    f = frame
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_LIBRARY_DIRS) and not f.f_code.co_filename.startswith("<"):
            return f"{f.f_code.co_name} ({display_path(f.f_code.co_filename)}:{f.f_lineno})", True
        f = f.f_back
    return (
        f"{frame.f_code.co_name} ({display_path(frame.f_code.co_filename)}:{frame.f_lineno})",
        False,
    )


class LoopWatch:
    """Install on the loop's (main) thread with `start()`; `close()` restores the handlers it
    replaced. on_signal(name) runs on the loop for every SIGINT/SIGTERM, as
    loop.add_signal_handler's callback would."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_signal: Callable[[str], None], *,
                 say: Callable[[str], None] = _say):
        self._loop, self._on_signal, self._say = loop, on_signal, say
        self._beat = time.monotonic()
        self._handle: Optional[asyncio.TimerHandle] = None
        self._thread: Optional[threading.Thread] = None
        self._loop_thread = threading.get_ident()
        self._closing = threading.Event()
        self._rsock = self._wsock = None
        self._old_handlers: dict = {}
        self._old_wakeup = -1
        self._sent = self._taken = 0              # signals seen by the watchdog / taken by the loop
        self._last_signal: tuple[float, int] = (0.0, 0)
        self._warned_unanswered = 0  # the signal count already answered from the watchdog
        self._named_beat = -1.0      # the heartbeat of the stall last named
        self._resumed = 0.0          # when the process last woke from a stop (SIGSTOP)
        self.blocked_reports = 0

    # ------------------------------------------------------------------ on the loop's thread
    def start(self) -> bool:
        """False where signals cannot be taken here (not the main thread): nothing installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(False)
        self._wsock.setblocking(False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
            for sig in SIGNALS:
                self._old_handlers[sig] = signal.signal(sig, _noop)
        except (ValueError, OSError):
            self.close()
            return False
        self._handle = self._loop.call_later(BEAT_S, self._tick)
        self._thread = threading.Thread(target=self._watch, name="forge-loopwatch", daemon=True)
        self._thread.start()
        return True

    def close(self) -> None:
        self._closing.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(2)
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            if self._wsock is not None:
                signal.set_wakeup_fd(self._old_wakeup)
        self._old_handlers.clear()
        for s in (self._rsock, self._wsock):
            if s is not None:
                s.close()
        self._rsock = self._wsock = None

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self._handle = self._loop.call_later(BEAT_S, self._tick)

    def _take(self, name: str, count: int) -> None:
        self._taken = max(self._taken, count)
        self._on_signal(name)

    # ------------------------------------------------------------------ on the watchdog's thread
    def _watch(self) -> None:
        last = time.monotonic()
        while not self._closing.is_set():
            try:
                ready, _, _ = select.select([self._rsock], [], [], BEAT_S)
            except (OSError, ValueError):
                return
            now = time.monotonic()
            # this thread did not run either: the process was stopped (SIGSTOP),
            if now - last > STOPPED_S:
                self._resumed = now  # not its loop blocked: the loop's silence counts from now
            last = now
            if ready:
                try:
                    data = self._rsock.recv(64)
                except (BlockingIOError, OSError):
                    data = b""
                for signum in data:
                    if signum in EXIT_CODE:
                        self._signalled(signal.Signals(signum))
            self._check()

    def _signalled(self, sig: signal.Signals) -> None:
        self._sent += 1
        self._last_signal = (time.monotonic(), sig)
        try:
            self._loop.call_soon_threadsafe(self._take, sig.name, self._sent)
        except RuntimeError:            # the loop is closed: nothing will take it
            pass
        self._check()

    def _check(self) -> None:
        now = time.monotonic()
        beat = self._beat
        silent = now - max(beat, self._resumed)
        # once per stall: until the loop beats again
        if silent >= REPORT_S and self._named_beat != beat:
            self._named_beat = beat
            self.blocked_reports += 1
            at, user = self._where()
            self._say(f"forge: the event loop has been blocked for {silent:.0f} s in {at}" + (
                ": synchronous code in a function stops every record, the node and Ctrl-C; await "
                "it instead "
                "(asyncio.sleep, asyncio.to_thread)" if user else ""))
        since, sig = self._last_signal
        if self._taken >= self._sent or now - since < ANSWER_S or silent < ANSWER_S:
            return
        if self._sent >= 2:                  # asked twice and the loop cannot answer: stop now
            self._say(f"forge: {sig.name} again: stopping now while {self._blocker()} holds the "
                      "event loop; every "
                      "row committed stays in the ledger and the records in flight run next time: "
                      "run the same "
                      "command again to resume")
            os._exit(EXIT_CODE[sig])
        if self._warned_unanswered < self._sent:
            self._warned_unanswered = self._sent
            again = "press Ctrl-C again" if sig == signal.SIGINT else f"send {sig.name} again"
            self._say(f"forge: {sig.name}: the event loop is blocked in {self._blocker()}; no new "
                      "record starts once "
                      f"it returns; {again} to stop now (records in flight stay in the ledger)")

    def _where(self) -> tuple[str, bool]:
        frame = sys._current_frames().get(self._loop_thread)
        return where(frame) if frame is not None else ("a function", True)

    def _blocker(self) -> str:
        return self._where()[0]


def _noop(signum, frame) -> None:
    """The Python-level handler: the watchdog does the work (Python's C handler writes the wakeup
    fd)."""
