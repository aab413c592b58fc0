"""An engine actor's process must not outlive its node: orphans keep computing and duplicate work.

Three layers, each enough on its own in the case it covers:
- the node agent owns its engine actors (not detached), so Ray kills them when the agent's driver exits;
- PR_SET_PDEATHSIG: the kernel SIGKILLs the actor's process the moment its parent (the raylet) dies —
  Ray 2.60 otherwise leaves a dead raylet's workers running for a minute or more;
- a watchdog thread: the parent changed (re-parented to init or a subreaper) or the agent's pid is gone
  (same machine only) -> exit at once. It covers what PDEATHSIG cannot (the signal follows the parent
  *thread* that forked us, and is cleared by some exec paths)."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from typing import Optional

from forge.runtime.registry import pid_alive

log = logging.getLogger("forge.cluster.guard")

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.25
EXIT_ORPHANED = 3


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch(agent_pid: Optional[int], agent_host: Optional[str], *, interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """Start the watchdog; the agent's pid is only watched when the agent runs on this machine."""
    parent = os.getppid()
    if agent_host != socket.gethostname() or not agent_pid or not pid_alive(agent_pid):
        agent_pid = None

    def run() -> None:
        stop = threading.Event()
        while not stop.wait(interval_s):
            why = None
            if os.getppid() != parent:
                why = f"its raylet (pid {parent}) is gone"
            elif agent_pid is not None and not pid_alive(agent_pid):
                why = f"its node agent (pid {agent_pid}) is gone"
            if why:
                log.error("engine actor pid %d exits: %s", os.getpid(), why)
                os._exit(EXIT_ORPHANED)

    t = threading.Thread(target=run, name="forge-orphan-guard", daemon=True)
    t.start()
    return t


def install(agent_pid: Optional[int], agent_host: Optional[str]) -> dict:
    """Both mechanisms; returns what is in force (reported by the engine's hello)."""
    pdeathsig = die_with_parent()
    watch(agent_pid, agent_host)
    return {"pdeathsig": pdeathsig, "watches_agent": bool(agent_pid and agent_host == socket.gethostname())}
