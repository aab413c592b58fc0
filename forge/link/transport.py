"""How a link's calls reach its engine host. One protocol (forge/host/engine_host.py: PROTOCOL), three carriers:

    thread   the host on this process's event loop: a call is an await (no copy, no IPC)
    process  the host in a worker process the node started (forge/link/process.py)
    ray      the host in a Ray actor (forge/cluster/actor.py)

A transport knows how to bring its host back after a loss (restart the worker, find the actor Ray
restarted) or that it cannot; everything else about a link (credit, batching, loss by (request id,
attempt), requeueing) is the same code for all three (forge/link/link.py)."""
from __future__ import annotations

import abc
from typing import Any


class LinkGone(Exception):
    """The host will not come back to this link (its restarts are spent, or its carrier cannot restart it)."""


class Transport(abc.ABC):
    name: str = "?"                  # what logs and messages call the host (its card, or its Ray actor)

    @abc.abstractmethod
    async def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        """The host's answer to method(*args); raises on any loss (timeout, connection, dead host)."""

    @abc.abstractmethod
    async def reconnect(self, why: str, *, engine_failed: bool, incarnation: str) -> dict:
        """Bring the host back (or find it back) and return its hello; LinkGone when it cannot come back.
        engine_failed: the host said its engine failed (incarnation is the one that failed)."""

    @abc.abstractmethod
    async def close(self, timeout_s: float) -> None:
        """Stop the host (its engine shuts down, in-flight work was given back) and free what carries it."""
