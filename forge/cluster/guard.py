"""An engine actor's process must not outlive its node: orphans keep computing and duplicate work.

Three layers, each enough on its own in the case it covers:
- the node agent owns its engine actors (not detached), so Ray kills them when the agent's driver
  exits;
- PR_SET_PDEATHSIG: the kernel SIGKILLs the actor's process the moment its parent (the raylet) dies
  — Ray 2.60 otherwise leaves a dead raylet's workers running for a minute or more;
- a watchdog thread: the parent changed (re-parented to init or a subreaper) or the agent's pid is
  gone (same machine only) -> exit at once. It covers what PDEATHSIG cannot (the signal follows the
  parent *thread* that forked us, and is cleared by some exec paths).
The first two are forge/host/lifeline.py, which a local node's worker processes use as well."""
from __future__ import annotations

import os
import socket
import threading
from typing import Optional

from forge.host.lifeline import EXIT_ORPHANED, WATCH_INTERVAL_S, die_with_parent, watch_parent
from forge.machine.registry import pid_alive

__all__ = ["EXIT_ORPHANED", "die_with_parent", "install", "watch"]


def watch(agent_pid: Optional[int], agent_host: Optional[str], *,
          interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """Start the watchdog; the agent's pid is only watched when the agent runs on this machine."""
    if agent_host != socket.gethostname() or not agent_pid or not pid_alive(agent_pid):
        agent_pid = None

    def agent_gone() -> Optional[str]:
        gone = agent_pid is not None and not pid_alive(agent_pid)
        return f"its node agent (pid {agent_pid}) is gone" if gone else None

    return watch_parent(os.getppid(), also=agent_gone, interval_s=interval_s, what="engine actor")


def install(agent_pid: Optional[int], agent_host: Optional[str]) -> dict:
    """Both mechanisms; returns what is in force (reported by the engine's hello)."""
    pdeathsig = die_with_parent()
    watch(agent_pid, agent_host)
    return {
        "pdeathsig": pdeathsig,
        "watches_agent": bool(agent_pid and agent_host == socket.gethostname()),
    }
