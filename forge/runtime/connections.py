"""Bounded connections for forge's HTTP servers, enforced where idle sockets live: uvicorn's protocol objects.

A flood of idle connections must not take the file descriptors the server needs to keep answering (`/health`
included). So, per server:

- at most `per_client` open connections per client address, and at most `total` in all (by default well below
  the process's file-descriptor limit, leaving a reserve for the node's own files and room for one burst of
  accepts);
- at either bound, a new connection evicts the oldest *idle* connection (no request in progress) of the address
  holding the most connections; if none of them is idle, the new connection is closed at once;
- a connection that has not sent a whole request head within `first_request_s` is closed (uvicorn's keep-alive
  timeout only starts after a first response, so a socket that never speaks would otherwise stay forever).

uvicorn's own `limit_concurrency` is not used: past it, every new request gets 503, health checks included."""
from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_PER_CLIENT = 1024
FD_RESERVE_FRACTION = 8          # keep 1/8 of the descriptors (at least FD_RESERVE_MIN) for everything else
FD_RESERVE_MIN = 256
FIRST_REQUEST_S = 10.0


@dataclass
class ConnectionLimits:
    per_client: int = DEFAULT_PER_CLIENT      # 0: no per-address bound
    total: Optional[int] = None               # None: from the file-descriptor limit (see fd_budget)
    first_request_s: float = FIRST_REQUEST_S


def fd_budget(backlog: int) -> tuple[int, int]:
    """(connections this process can hold, the listen backlog to use). The descriptor limit is raised to the hard
    limit first, as servers do. asyncio accepts up to `backlog` sockets in one go before any of them reaches
    this book, and the sockets evicted to make room for them close only on the loop's next turn. So the backlog is
    capped at an eighth of the limit and twice it is kept free besides the reserve: a burst of accepts then never
    meets EMFILE (which stops all accepting for a second)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    soft = min(soft if soft != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    backlog = max(16, min(backlog, soft // 8))
    # two bursts: the sockets evicted to make room for one burst close on the loop's next turn
    return max(16, soft - max(FD_RESERVE_MIN, soft // FD_RESERVE_FRACTION) - 2 * backlog), backlog


def _idle(proto: Any) -> bool:
    cycle = getattr(proto, "cycle", None)
    return cycle is None or bool(getattr(cycle, "response_complete", False))


def _address(proto: Any) -> str:
    client = getattr(proto, "client", None)
    return str(client[0]) if client else "local"


class ConnectionBook:
    """The server's open connections by client address, oldest first."""

    def __init__(self, limits: ConnectionLimits, backlog: int = 2048):
        self.limits = limits
        budget, self.backlog = fd_budget(backlog)
        self.total = limits.total if limits.total is not None else budget
        self.by_client: dict[str, OrderedDict[Any, None]] = {}
        self.open = 0
        self.evicted = self.refused = self.timed_out = 0
        self._timers: dict[Any, asyncio.TimerHandle] = {}

    def admit(self, proto: Any) -> None:
        """A connection was made: keep it (evicting an idle one if a bound is reached) or close it."""
        addr = _address(proto)
        mine = self.by_client.get(addr)
        if self.limits.per_client and mine is not None and len(mine) >= self.limits.per_client:
            if not self._evict_from(addr):
                return self._refuse(proto)
        if self.open >= self.total and not self._evict_from(max(self.by_client, key=lambda a: len(self.by_client[a]))):
            return self._refuse(proto)
        self.by_client.setdefault(addr, OrderedDict())[proto] = None
        self.open += 1
        if self.limits.first_request_s > 0:
            self._timers[proto] = asyncio.get_running_loop().call_later(self.limits.first_request_s,
                                                                        self._first_request_due, proto)

    def leave(self, proto: Any) -> None:
        """The connection is gone (idempotent: evicted ones have left already)."""
        timer = self._timers.pop(proto, None)
        if timer is not None:
            timer.cancel()
        mine = self.by_client.get(_address(proto))
        if mine is not None and mine.pop(proto, False) is None:
            self.open -= 1
            if not mine:
                del self.by_client[_address(proto)]

    def stats(self) -> dict:
        return {"open": self.open, "clients": len(self.by_client), "limit_total": self.total,
                "limit_per_client": self.limits.per_client, "evicted": self.evicted, "refused": self.refused,
                "closed_without_request": self.timed_out}

    def _evict_from(self, addr: str) -> bool:
        for proto in self.by_client.get(addr, ()):
            if _idle(proto):
                self.leave(proto)
                self.evicted += 1
                proto.transport.close()
                return True
        return False

    def _refuse(self, proto: Any) -> None:
        self.refused += 1
        proto.transport.close()

    def _first_request_due(self, proto: Any) -> None:
        self._timers.pop(proto, None)
        if getattr(proto, "cycle", None) is None and proto in self.by_client.get(_address(proto), ()):
            self.leave(proto)
            self.timed_out += 1
            proto.transport.close()


def limited_protocol(base: type, book: ConnectionBook) -> type:
    """uvicorn's HTTP protocol class `base`, with its connections kept in `book`."""

    class Limited(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport):
            super().connection_made(transport)
            book.admit(self)

        def connection_lost(self, exc):
            book.leave(self)
            super().connection_lost(exc)

    Limited.__name__ = f"Limited{base.__name__}"
    return Limited
