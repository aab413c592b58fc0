"""Ctrl-C before a command has anything to drain: say so and exit at once.

While a node starts, its engines load in threads that cannot be interrupted (minutes for a large
model): Python's own Ctrl-C would wait for them. Until the command installs its own drain (the job
runner, the node's server do, replacing these handlers), a SIGINT or SIGTERM prints one line and
ends the process. What was opened so far (a ledger, a node's name) is crash-safe by design and
released by the OS.

Python runs a signal's handler in the main thread, and only once that thread runs Python again; the
kernel may deliver the signal to another thread, and then a main thread blocked in a system call (an
event loop's wait with nothing due) is not woken and the handler waits with it (a Ctrl-C during an
engine's load once went unanswered for over 10 s). So the C-level handler also writes the signal's
number to a socket (`signal.set_wakeup_fd`), whichever thread took it, and a thread of its own
answers from there."""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading


def exit_at_once_until_draining(what: str) -> None:
    """Install the handlers; `what` completes "forge: SIGINT <what>: stopping now"."""
    line = f"forge: {{}} {what}: stopping now\n"
    # the handler and the watching thread may both see one signal: one line, one exit
    once = threading.Lock()

    def exit_now(signum: int) -> None:
        if not once.acquire(blocking=False):
            threading.Event().wait(30)           # the other one is ending the process
            return
        try:
            os.write(2, line.format(signal.Signals(signum).name).encode("utf-8", "replace"))
        except (OSError, ValueError):
            pass
        finally:
            os._exit(130 if signum == signal.SIGINT else 143)

    def stop(signum, _frame) -> None:
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - the exit matters, not what was left in a buffer
            pass
        exit_now(signum)

    mine = [sig for sig in (signal.SIGINT, signal.SIGTERM)
            # a shell's background job ignores Ctrl-C: keep it so
            if signal.getsignal(sig) is not signal.SIG_IGN]
    for sig in mine:
        signal.signal(sig, stop)
    if not mine or threading.current_thread() is not threading.main_thread():
        return
    # A blocked mask is inherited too (Ray's process launcher blocks SIGINT in what it starts):
    # these signals are forge's to answer, so this thread takes them again, and so does every thread
    # started after it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(mine))
    rsock, wsock = socket.socketpair()
    wsock.setblocking(False)
    signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                data = rsock.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                # Only while these handlers are installed: a drain installed later has its own
                # wakeup socket.
                if signum in mine and signal.getsignal(signum) is stop:
                    exit_now(signum)

    threading.Thread(target=watch, name="forge-exit-at-once", daemon=True).start()
    _keep.append((rsock, wsock))


_keep: list = []        # the wakeup sockets live as long as the process
