"""How a link's calls reach its engine host. One protocol (forge/host/protocol.py: HostMethod and
its records), three carriers:

    thread   the host on this process's event loop: a call is an await (no copy, no IPC)
    process  the host in a worker process the node started (forge/link/process.py)
    ray      the host in a Ray actor (forge/cluster/actor.py)

A carrier implements `call` (one HostMethod with its arguments, answered or raising on any loss);
the typed methods below are written once over it, so links and nodes never name a method by a
string. A transport also knows how to bring its host back after a loss (restart the worker, find the
actor Ray restarted) or that it cannot; everything else about a link (credit, batching, loss by
(request id, attempt), requeueing) is the same code for all three (forge/link/link.py)."""
from __future__ import annotations

import abc
from typing import Any, Sequence

from forge.host.protocol import Collected, Hello, HostMethod, WireRequest, requests_to_send
from forge.stats import EngineStats


class LinkGone(Exception):
    """The host will not come back to this link (its restarts are spent, or its carrier cannot
    restart it)."""


class Transport(abc.ABC):
    name: str = "?"  # what logs and messages call the host (its card, or its Ray actor)

    @abc.abstractmethod
    async def call(self, method: HostMethod, *args: Any, timeout_s: float) -> Any:
        """The host's answer to method(*args); raises on any loss (timeout, connection, dead
        host)."""

    @abc.abstractmethod
    async def reconnect(self, why: str, *, engine_failed: bool, incarnation: str) -> Hello:
        """Bring the host back (or find it back) and return its hello; LinkGone when it cannot come
        back. engine_failed: the host said its engine failed (incarnation is the one that
        failed)."""

    @abc.abstractmethod
    async def close(self, timeout_s: float) -> None:
        """Stop the host (its engine shuts down, in-flight work was given back) and free what
        carries it."""

    # ------------------------------------------------------------------ the host's methods, typed
    # (HostMethod)
    async def hello(self, *, timeout_s: float) -> Hello:
        return await self.call(HostMethod.HELLO, timeout_s=timeout_s)

    async def tokenizer_copy(self, *, timeout_s: float) -> tuple[Any, list[tuple[str, list[int]]]]:
        """The tokenizer a node measures with, and the engine's own ids for a few probe texts to
        check it by."""
        return await self.call(HostMethod.TOKENIZER_COPY, timeout_s=timeout_s)

    async def encode(self, texts: list[str], *, timeout_s: float) -> list[list[int]]:
        return await self.call(HostMethod.ENCODE, texts, timeout_s=timeout_s)

    async def submit(self, session: str, items: Sequence[WireRequest], *, timeout_s: float) -> int:
        """Queue a batch on the host; returns how many it queued (the others come back through
        collect)."""
        return await self.call(
            HostMethod.SUBMIT, session, requests_to_send(items), timeout_s=timeout_s
        )

    async def collect(
        self, session: str, wait_s: float, max_items: int, *, timeout_s: float
    ) -> Collected:
        """A long poll: answers as soon as something is ready for the session, or after wait_s."""
        return await self.call(HostMethod.COLLECT, session, wait_s, max_items, timeout_s=timeout_s)

    async def cancel(self, session: str, keys: list[tuple[str, int]], *, timeout_s: float) -> int:
        """Stop these dispatches (rid, attempt); each is still answered (cancelled) through
        collect."""
        return await self.call(HostMethod.CANCEL, session, keys, timeout_s=timeout_s)

    async def end_session(self, session: str, *, timeout_s: float) -> None:
        await self.call(HostMethod.END_SESSION, session, timeout_s=timeout_s)

    async def stats(self, *, timeout_s: float) -> EngineStats:
        return await self.call(HostMethod.STATS, timeout_s=timeout_s)

    async def drain(self, within_s: float, *, timeout_s: float) -> bool:
        """The host takes nothing new and lets in-flight work finish, for up to within_s; True if it
        all did."""
        return await self.call(HostMethod.DRAIN, within_s, timeout_s=timeout_s)

    async def stop(self, *, timeout_s: float) -> None:
        """The host gives in-flight work back and shuts its engine down (its carrier stays: see
        close)."""
        await self.call(HostMethod.STOP, timeout_s=timeout_s)
