"""A process that must not outlive its parent: orphans keep computing, hold a card and duplicate
work.

Two mechanisms, each enough where it works:
- PR_SET_PDEATHSIG (Linux): the kernel SIGKILLs this process the moment its parent dies, however it
  dies. The signal follows the parent *thread* that started us, so a node starts its workers from
  its event loop's thread, which lives as long as the node.
- a watchdog thread (any POSIX system): the parent changed (we were re-parented to init or a
  subreaper) or another check says we are orphaned -> exit at once. A worker also exits when its
  link to the node reaches end of file (forge/host/worker.py)."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from typing import Callable, Optional

log = logging.getLogger("forge.host.lifeline")

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.25
EXIT_ORPHANED = 3


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); False where
    unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent: int, *, also: Optional[Callable[[], Optional[str]]] = None,
                 interval_s: float = WATCH_INTERVAL_S, what: str = "process") -> threading.Thread:
    """Exit (EXIT_ORPHANED) as soon as our parent is no longer `parent`, or `also()` names a
    reason."""
    if os.getppid() != parent:          # it died before we could even watch it
        os._exit(EXIT_ORPHANED)

    def run() -> None:
        stop = threading.Event()
        while not stop.wait(interval_s):
            why = (
                f"its parent (pid {parent}) is gone"
                if os.getppid() != parent
                else (also() if also else None)
            )
            if why:
                log.error("%s pid %d exits: %s", what, os.getpid(), why)
                os._exit(EXIT_ORPHANED)

    t = threading.Thread(target=run, name="forge-lifeline", daemon=True)
    t.start()
    return t
