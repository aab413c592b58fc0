"""The in-flight table of one admission runtime: the requests it owns, the ones the engine still
holds after they were given back, and the slot and KV-block reservation both add up to. Pure
bookkeeping, no I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from forge.engines.interface import RequestKey
from forge.host.request import HostRequest


@dataclass(eq=False)
class Flight:
    """A request this runtime owns: taken from its source, not yet delivered or given back."""

    req: HostRequest
    key: RequestKey  # the request's key, its id inside the engine too: it carries the attempt, so a
    blocks: int  # requeued copy never collides with an older copy the engine has not let go of yet
    input_tokens: int
    seq: int                  # admission order; the highest is the youngest
    deadline: Optional[float]
    # sending (the driver has it) -> running (the engine has it) | waiting (backoff)
    state: str = "sending"
    refusals: int = 0


class FlightTable:
    """Slots and blocks are held by live flights and by orphans (keys given back or failed whose
    engine copy has not come back yet): the engine still spends its slot and KV blocks on them."""

    def __init__(self, slots: int, kv_blocks: int, queue_slots: int = 0):
        """slots: the engine's (max_batch_size); queue_slots: what it may hold beyond them in its
        own waiting queue (EngineGeometry.queue_slots). Every held request, running or waiting
        there, reserves its KV blocks."""
        self.slots, self.kv_blocks, self.held = slots, kv_blocks, slots + queue_slots
        self.live: dict[RequestKey, Flight] = {}
        self.orphans: dict[RequestKey, int] = {}    # key -> blocks
        self.reserved = 0
        self._seq = 0

    def __len__(self) -> int:
        return len(self.live)

    def in_flight(self) -> int:
        return len(self.live) + len(self.orphans)

    def occupancy(self) -> float:
        """The share of the binding resource in use: slots (what waits in the engine's queue runs in
        none) or KV blocks (reserved for waiting requests too), whichever is fuller."""
        return max(min(self.in_flight(), self.slots) / self.slots if self.slots else 1.0,
                   self.reserved / self.kv_blocks if self.kv_blocks else 1.0)

    def free_slots(self) -> int:
        """Requests admission may still hand the engine: its slots and its own queue's, less what it
        holds."""
        return self.held - self.in_flight()

    def free_kv_blocks(self) -> int:
        return self.kv_blocks - self.reserved

    def fits(self, blocks: int) -> bool:
        return self.free_slots() >= 1 and blocks <= self.free_kv_blocks()

    def add(
        self, req: HostRequest, *, blocks: int, input_tokens: int, deadline: Optional[float]
    ) -> Optional[Flight]:
        """Reserve for a new flight under the request's key; None when it does not fit or the key is
        still in use."""
        key = req.key
        if not self.fits(blocks) or key in self.live or key in self.orphans:
            return None
        self._seq += 1
        f = Flight(
            req=req,
            key=key,
            blocks=blocks,
            input_tokens=input_tokens,
            seq=self._seq,
            deadline=deadline,
        )
        self.live[key] = f
        self.reserved += blocks
        return f

    def owns(self, f: Flight) -> bool:
        return self.live.get(f.key) is f

    def returned(self, key: RequestKey) -> Optional[Flight]:
        """The engine gave `key` back (a result): free its reservation; its flight if we still own
        it."""
        f = self.live.pop(key, None)
        self.reserved -= f.blocks if f is not None else self.orphans.pop(key, 0)
        return f

    def release(self, f: Flight, *, engine_holds: bool) -> None:
        """We stop owning `f`. If the engine may still hold it, its slot and blocks stay
        reserved."""
        del self.live[f.key]
        if engine_holds:
            self.orphans[f.key] = f.blocks
        else:
            self.reserved -= f.blocks

    def forget_engine(self) -> None:
        """The engine is gone: nothing it held is held any more."""
        for blocks in self.orphans.values():
            self.reserved -= blocks
        self.orphans.clear()

    def running(self) -> list[Flight]:
        return [f for f in self.live.values() if f.state == "running"]

    def youngest_running(self) -> Optional[Flight]:
        return max(self.running(), key=lambda f: f.seq, default=None)

    def expired(self, now: float) -> list[Flight]:
        """Flights past their deadline whose place is known (not on their way to the engine)."""
        return [
            f
            for f in self.live.values()
            if f.deadline is not None and now >= f.deadline and f.state != "sending"
        ]
