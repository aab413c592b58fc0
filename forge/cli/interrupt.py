"""Ctrl-C before a command has anything to drain: say so and exit at once.

While a node starts, its engines load in threads that cannot be interrupted (minutes for a large model):
Python's own Ctrl-C would wait for them. Until the command installs its own drain (the job runner, the
node's server do, replacing these handlers), a SIGINT or SIGTERM prints one line and ends the process.
What was opened so far (a ledger, a node's name) is crash-safe by design and released by the OS."""
from __future__ import annotations

import os
import signal
import sys


def exit_at_once_until_draining(what: str) -> None:
    """Install the handlers; `what` completes "forge: SIGINT <what>: stopping now"."""

    def stop(signum, _frame) -> None:
        name = signal.Signals(signum).name
        try:
            print(f"forge: {name} {what}: stopping now", file=sys.stderr, flush=True)
        finally:
            os._exit(130 if signum == signal.SIGINT else 143)

    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:      # a shell's background job ignores Ctrl-C: keep it so
            signal.signal(sig, stop)
