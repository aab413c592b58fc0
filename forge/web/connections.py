"""Bounded connections for forge's HTTP servers, enforced where idle sockets live: uvicorn's
protocol objects.

A flood of idle connections must not take the file descriptors the server needs to keep answering
(`/health` included). So, per server:

- at most `per_client` open connections per client address, and at most `total` in all (by default
  well below the process's file-descriptor limit, leaving a reserve for the node's own files and
  room for one burst of accepts);
- at either bound, a new connection evicts the oldest *idle* connection (no request in progress) of
  the address holding the most connections; if none of them is idle, the new connection is closed at
  once;
- a connection that has not sent a whole request head within `first_request_s` is closed (uvicorn's
  keep-alive timeout only starts after a first response, so a socket that never speaks would
  otherwise stay forever);
- every request head, on every request of a keep-alive connection, must be whole within `head_s` of
  its first byte, and every body must arrive at `min_body_rate` bytes/s on average once
  `body_grace_s` have passed (time uvicorn holds reading, waiting for the app to take what it read,
  is not the client's): else a 408 in forge's error shape and the connection closed. uvicorn has no
  read deadline of its own: its keep-alive timeout is cancelled by the first byte of the next head
  and never armed again, so a client sending a byte every few seconds held a connection forever.

uvicorn's own `limit_concurrency` is not used: past it, every new request gets 503, health checks
included."""
from __future__ import annotations

import asyncio
import json
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_PER_CLIENT = 1024
FD_RESERVE_FRACTION = 8  # keep 1/8 of the descriptors (at least FD_RESERVE_MIN) for everything else
FD_RESERVE_MIN = 256
FIRST_REQUEST_S = 10.0
HEAD_S = 10.0              # a request head, from its first byte to its last
BODY_GRACE_S = 10.0        # a body's first seconds are not judged (a client's slow start)
MIN_BODY_RATE = 16 * 1024  # bytes/s a body must average after the grace: 32 MiB within ~35 min
BODY_CHECK_S = 1.0


@dataclass
class ConnectionLimits:
    per_client: int = DEFAULT_PER_CLIENT      # 0: no per-address bound
    total: Optional[int] = None               # None: from the file-descriptor limit (see fd_budget)
    first_request_s: float = FIRST_REQUEST_S
    head_s: float = HEAD_S                    # 0: no deadline on heads after the first
    body_grace_s: float = BODY_GRACE_S
    min_body_rate: int = MIN_BODY_RATE        # 0: no deadline on bodies


def fd_budget(backlog: int) -> tuple[int, int]:
    """(connections this process can hold, the listen backlog to use). The descriptor limit is
    raised to the hard limit first, as servers do. asyncio accepts up to `backlog` sockets in one go
    before any of them reaches this book, and the sockets evicted to make room for them close only
    on the loop's next turn. So the backlog is capped at an eighth of the limit and twice it is kept
    free besides the reserve: a burst of accepts then never meets EMFILE (which stops all accepting
    for a second)."""
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


class _Read:
    """What a connection is reading now: a request head (cycle None) or `cycle`'s body."""
    __slots__ = ("cycle", "t0", "bytes", "timer")

    def __init__(self, cycle: Any, t0: float):
        self.cycle, self.t0, self.bytes, self.timer = cycle, t0, 0, None


class ConnectionBook:
    """The server's open connections by client address, oldest first."""

    def __init__(self, limits: ConnectionLimits, backlog: int = 2048):
        self.limits = limits
        budget, self.backlog = fd_budget(backlog)
        self.total = limits.total if limits.total is not None else budget
        self.by_client: dict[str, OrderedDict[Any, None]] = {}
        self.open = 0
        self.evicted = self.refused = self.timed_out = self.slow_heads = self.slow_bodies = 0
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self._reads: dict[Any, _Read] = {}

    def admit(self, proto: Any) -> None:
        """A connection was made: keep it (evicting an idle one if a bound is reached) or close
        it."""
        addr = _address(proto)
        mine = self.by_client.get(addr)
        if self.limits.per_client and mine is not None and len(mine) >= self.limits.per_client:
            if not self._evict_from(addr):
                return self._refuse(proto)
        if self.open >= self.total and not self._evict_from(
            max(self.by_client, key=lambda a: len(self.by_client[a]))
        ):
            return self._refuse(proto)
        self.by_client.setdefault(addr, OrderedDict())[proto] = None
        self.open += 1
        if self.limits.first_request_s > 0:
            self._timers[proto] = asyncio.get_running_loop().call_later(
                self.limits.first_request_s, self._first_request_due, proto
            )

    def leave(self, proto: Any) -> None:
        """The connection is gone (idempotent: evicted ones have left already)."""
        timer = self._timers.pop(proto, None)
        if timer is not None:
            timer.cancel()
        self._stop_reading(proto)
        mine = self.by_client.get(_address(proto))
        if mine is not None and mine.pop(proto, False) is None:
            self.open -= 1
            if not mine:
                del self.by_client[_address(proto)]

    def stats(self) -> dict:
        return {
            "open": self.open,
            "clients": len(self.by_client),
            "limit_total": self.total,
            "limit_per_client": self.limits.per_client,
            "evicted": self.evicted,
            "refused": self.refused,
            "closed_without_request": self.timed_out,
            "slow_heads_closed": self.slow_heads,
            "slow_bodies_closed": self.slow_bodies,
        }

    # ------------------------------------------------------------------ read deadlines
    def received(self, proto: Any, n: int) -> None:
        """`n` bytes reached `proto` (and its parser): start, go on with or end the deadline of what
        it reads."""
        if getattr(proto, "transport", None) is None or proto.transport.is_closing():
            return
        cycle = getattr(proto, "cycle", None)
        if cycle is None or getattr(cycle, "response_complete", False):
            want = None  # a head is coming in: no request started from it yet
            if self.limits.head_s <= 0:
                return self._stop_reading(proto)
        elif getattr(cycle, "more_body", False) and not getattr(cycle, "disconnected", False):
            want = cycle                                  # the request's body is coming in
            if self.limits.min_body_rate <= 0:
                return self._stop_reading(proto)
        else:
            return self._stop_reading(proto)  # the whole request is in: the app's to answer
        read = self._reads.get(proto)
        if read is not None and read.cycle is want:
            read.bytes += n
            return
        self._stop_reading(proto)
        read = self._reads[proto] = _Read(want, time.monotonic())
        loop = asyncio.get_running_loop()
        if want is None:
            read.timer = loop.call_later(self.limits.head_s, self._head_due, proto, read)
        else:
            read.timer = loop.call_later(self.limits.body_grace_s, self._body_due, proto, read)

    def _stop_reading(self, proto: Any) -> None:
        read = self._reads.pop(proto, None)
        if read is not None and read.timer is not None:
            read.timer.cancel()

    def _head_due(self, proto: Any, read: _Read) -> None:
        if self._reads.get(proto) is read:
            self.slow_heads += 1
            self._time_out(proto, "the request head was not complete within "
                                  f"{self.limits.head_s:g} s")

    def _body_due(self, proto: Any, read: _Read) -> None:
        if self._reads.get(proto) is not read:
            return
        now = time.monotonic()
        flow = getattr(proto, "flow", None)
        if flow is not None and getattr(flow, "read_paused", False):
            read.t0 += BODY_CHECK_S  # uvicorn holds reading for the app: not the client's time
        elif read.bytes < self.limits.min_body_rate * max(
            0.0, now - read.t0 - self.limits.body_grace_s
        ):
            self.slow_bodies += 1
            return self._time_out(proto, "the request body came slower than "
                                         f"{self.limits.min_body_rate:,} "
                                         f"bytes/s ({read.bytes:,} bytes in {now - read.t0:.0f} s)")
        read.timer = asyncio.get_running_loop().call_later(
            BODY_CHECK_S, self._body_due, proto, read
        )

    def _time_out(self, proto: Any, why: str) -> None:
        """408 in forge's shape where no answer has started, then close."""
        self._stop_reading(proto)
        cycle = getattr(proto, "cycle", None)
        if cycle is None or not (getattr(cycle, "response_started", False)
                                 and not getattr(cycle, "response_complete", False)):
            from forge.web.errors import error_body

            body = json.dumps(error_body(408, "request_timeout", why)).encode()
            proto.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        proto.transport.close()

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
        if getattr(proto, "cycle", None) is None and proto in self.by_client.get(
            _address(proto), ()
        ):
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

        def data_received(self, data):
            super().data_received(data)
            book.received(self, len(data))

    Limited.__name__ = f"Limited{base.__name__}"
    return Limited
