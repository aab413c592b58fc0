"""Overload is an answer, not a hang: per-endpoint concurrency bounds, Retry-After, per-request
deadlines.

Each endpoint admits at most `limit` requests at once, derived from the node's budgets (its cards'
slots, i.e. contract limits.max_batch_size, times a small factor: enough queued behind the running
ones to keep every slot busy, few enough that a waiting request is served within a few batch turns).
One more is refused at once with 429 and a Retry-After estimated from the endpoint's recent
latency."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

ONLINE_PRIORITY = 10  # broker priority of online requests; bulk jobs use 0 (served first: higher)
CONCURRENCY_FACTOR = 2           # per endpoint: requests in progress <= factor x the node's slots
DEFAULT_DEADLINE_S = 60.0        # a request's deadline when the client names none
MAX_DEADLINE_S = 600.0
DEADLINE_HEADER = "x-forge-deadline"   # seconds, e.g. "X-Forge-Deadline: 2.5"
LATENCY_HALF_LIFE = 32           # requests: the latency EWMA behind Retry-After


class Overloaded(Exception):
    """The endpoint (or the node's broker) is full; answer 429 with Retry-After."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadDeadline(ValueError):
    pass


def node_slots(description: dict) -> int:
    """Slots on the node: the sum of its cards' contract limits.max_batch_size (from the node's
    describe())."""
    return sum(int(c["limits"]["max_batch_size"]) for c in description.get("cards", [])) or 1


def deadline_s(
    header: Optional[str], body: Optional[float], default_s: float, max_s: float = MAX_DEADLINE_S
) -> float:
    """The request's deadline in seconds: the body field, else the header, else the server default;
    capped."""
    value: Optional[float] = body
    if value is None and header is not None:
        try:
            value = float(header)
        except ValueError:
            raise BadDeadline(f"header {DEADLINE_HEADER}: expected seconds as a number, got "
                              f"{header!r}") from None
    if value is None:
        value = default_s
    if not (value > 0 and math.isfinite(value)):
        raise BadDeadline(f"deadline must be a positive number of seconds, got {value!r}")
    return min(value, max_s)


@dataclass
class EndpointGate:
    name: str
    limit: int
    active: int = 0
    admitted: int = 0
    refused: int = 0
    completed: int = 0
    failed: int = 0
    latency_s: float = field(default=0.0)     # EWMA of admitted requests' latency

    def retry_after_s(self) -> int:
        return max(1, min(60, math.ceil(self.latency_s or 1.0)))

    def enter(self) -> "Slot":
        if self.active >= self.limit:
            self.refused += 1
            raise Overloaded(f"{self.name}: {self.active} requests in progress (limit "
                             f"{self.limit}); retry later",
                             self.retry_after_s())
        self.active += 1
        self.admitted += 1
        return Slot(self, time.monotonic())

    def _leave(self, elapsed_s: float, ok: bool) -> None:
        self.active -= 1
        if ok:
            self.completed += 1
            a = 1.0 / LATENCY_HALF_LIFE
            self.latency_s = (
                elapsed_s if self.latency_s == 0 else (1 - a) * self.latency_s + a * elapsed_s
            )
        else:
            self.failed += 1

    def stats(self) -> dict:
        return {
            "limit": self.limit,
            "active": self.active,
            "admitted": self.admitted,
            "refused": self.refused,
            "completed": self.completed,
            "failed": self.failed,
            "latency_s": round(self.latency_s, 4),
        }


class Slot:
    """One admitted request's place in its endpoint; released exactly once (however many paths
    try)."""

    def __init__(self, gate: EndpointGate, t0: float):
        self.gate, self.t0, self.ok, self._open = gate, t0, False, True

    def release(self) -> None:
        if self._open:
            self._open = False
            self.gate._leave(time.monotonic() - self.t0, self.ok)
