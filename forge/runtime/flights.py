"""The in-flight table of one admission runtime: the requests it owns, the ones the engine still holds after
they were given back, and the slot and KV-block reservation both add up to. Pure bookkeeping, no I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from forge.broker import BrokerRequest


@dataclass(eq=False)
class Flight:
    """A request this runtime owns: taken from the broker, not yet delivered or given back."""

    req: BrokerRequest
    key: str                  # its id inside the engine: request id + attempt, so a requeued copy never
    blocks: int               # collides with an older copy the engine has not let go of yet
    input_tokens: int
    seq: int                  # admission order; the highest is the youngest
    prefix: tuple[int, ...]   # chain hashes of its full prompt blocks (shared with same-prefix flights)
    deadline: Optional[float]
    state: str = "sending"    # sending (the driver has it) -> running (the engine has it) | waiting (backoff)
    refusals: int = 0


class FlightTable:
    """Slots and blocks are held by live flights and by orphans (keys given back or failed whose engine
    copy has not come back yet): the engine still spends its slot and KV blocks on them.

    With block reuse, a full prompt block whose chain hash another flight already holds is reserved once:
    the engine shares it. Without that credit, admission charges every request its whole prompt and a
    small pool admits a fraction of the same-prefix work the engine could hold (measured on the H200:
    docs/benchmarks.md)."""

    def __init__(self, slots: int, kv_blocks: int):
        self.slots, self.kv_blocks = slots, kv_blocks
        self.live: dict[str, Flight] = {}
        self.orphans: dict[str, Flight] = {}    # key -> the flight whose reservation the engine still holds
        self.reserved = 0
        self.prefix_refs: dict[int, int] = {}   # chain hash -> flights (live or orphan) holding that block
        self._seq = 0

    def charge(self, blocks: int, prefix: tuple[int, ...]) -> int:
        """Blocks a new flight adds to the reservation: its own, plus prefix blocks nobody holds yet."""
        return blocks - sum(1 for h in prefix if h in self.prefix_refs)

    def _hold(self, f: Flight) -> None:
        self.reserved += self.charge(f.blocks, f.prefix)
        for h in f.prefix:
            self.prefix_refs[h] = self.prefix_refs.get(h, 0) + 1

    def _free(self, f: Flight) -> None:
        freed = f.blocks - len(f.prefix)
        for h in f.prefix:
            n = self.prefix_refs[h] - 1
            if n:
                self.prefix_refs[h] = n
            else:
                del self.prefix_refs[h]
                freed += 1
        self.reserved -= freed

    def __len__(self) -> int:
        return len(self.live)

    def in_flight(self) -> int:
        return len(self.live) + len(self.orphans)

    def free_slots(self) -> int:
        return self.slots - self.in_flight()

    def free_kv_blocks(self) -> int:
        return self.kv_blocks - self.reserved

    def fits(self, blocks: int, prefix: tuple[int, ...] = ()) -> bool:
        return self.free_slots() >= 1 and self.charge(blocks, prefix) <= self.free_kv_blocks()

    def add(self, req: BrokerRequest, *, key: str, blocks: int, input_tokens: int,
            deadline: Optional[float], prefix: tuple[int, ...] = ()) -> Optional[Flight]:
        """Reserve for a new flight; None when it does not fit or its key is still in use.
        `prefix`: chain hashes of its full prompt blocks when the engine reuses blocks, else ()."""
        if not self.fits(blocks, prefix) or key in self.live or key in self.orphans:
            return None
        self._seq += 1
        f = Flight(req=req, key=key, blocks=blocks, input_tokens=input_tokens, seq=self._seq, deadline=deadline,
                   prefix=prefix)
        self.live[key] = f
        self._hold(f)
        return f

    def owns(self, f: Flight) -> bool:
        return self.live.get(f.key) is f

    def returned(self, key: str) -> Optional[Flight]:
        """The engine gave `key` back (a result): free its reservation; its flight if we still own it."""
        f = self.live.pop(key, None)
        held = f if f is not None else self.orphans.pop(key, None)
        if held is not None:
            self._free(held)
        return f

    def release(self, f: Flight, *, engine_holds: bool) -> None:
        """We stop owning `f`. If the engine may still hold it, its slot and blocks stay reserved."""
        del self.live[f.key]
        if engine_holds:
            self.orphans[f.key] = f
        else:
            self._free(f)

    def forget_engine(self) -> None:
        """The engine is gone: nothing it held is held any more."""
        for f in self.orphans.values():
            self._free(f)
        self.orphans.clear()

    def running(self) -> list[Flight]:
        return [f for f in self.live.values() if f.state == "running"]

    def youngest_running(self) -> Optional[Flight]:
        return max(self.running(), key=lambda f: f.seq, default=None)

    def expired(self, now: float) -> list[Flight]:
        """Flights past their deadline whose place is known (not on their way to the engine)."""
        return [f for f in self.live.values() if f.deadline is not None and now >= f.deadline and f.state != "sending"]
