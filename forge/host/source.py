"""AdmissionSource: everything an admission runtime (forge/host/admission.py) calls on where its
requests come from, and nothing more. In an engine host that is the host's LinkSessions
(forge/host/link_sessions.py): one engine's queue, filled by the links, with results and given-back
requests going back to the link each came on. The source is always this one engine's, so no call
names an engine."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from forge.host.request import HostRequest


@runtime_checkable
class AdmissionSource(Protocol):
    async def take(
        self, *, free_slots: int, free_kv_blocks: int, timeout_s: float
    ) -> list[HostRequest]:
        """A batch within the engine's free slots and KV blocks (and its token budget), waiting up
        to `timeout_s` for one; [] when nothing comes. Admission owns each request taken until it
        calls on_done or requeue."""
        ...

    def on_done(self, req: HostRequest) -> None:
        """Admission settled `req` (delivered, failed or cancelled; `deliver` has its result)."""
        ...

    def requeue(self, reqs: list[HostRequest]) -> None:
        """Admission gives these back unfinished (refused, taken back from a stall, stopped, the
        engine failed): they go back to whoever dispatched them, to be sent again as their next
        attempt."""
        ...

    def record_delivery(self, tokens: int, elapsed_s: float, occupancy: float) -> None:
        """`tokens` (input + output) delivered over `elapsed_s` busy seconds with `occupancy` (0..1)
        of the slots or KV blocks in use on average: the balancing signal of the node's broker."""
        ...

    def set_engine_healthy(self, healthy: bool) -> None:
        """The engine failed or is wedged (False), or recovered (True)."""
        ...
