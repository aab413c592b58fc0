"""The engine host's side of its links: one engine's queue (forge/host/queue.py), filled by the
links, which is what its admission runtime takes from (LinkSessions is its AdmissionSource,
forge/host/source.py).

A node (or a cluster job's driver) holds the broker that sees every card (grouping, affinity,
balancing) and sends each engine host batches within that engine's credit. Here they wait in the
host's queue until admission takes them to fit the engine's own token budget, slots and KV blocks.
What admission gives back (refusals, stall take-backs, stop) goes back to the link it came on, which
requeues it in the node's broker. Results wait per link session until the link collects them.

Sessions: one per link. A session not collected for `lease_s` is ended (its node died): its queued
work is dropped when taken and its results are discarded, so a dead node costs bounded work."""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable, Optional

from forge.broker import EngineGeometry, NoEngineFits, QueueFull
from forge.engines.interface import RequestKey
from forge.host.protocol import Collected, Delivered, WireResult, given_up
from forge.host.queue import HostQueue
from forge.host.request import HostRequest
from forge.host.wire import wire_result

ENDED_REMEMBERED = 4096


class Session:
    def __init__(self, sid: str, now: float):
        self.sid = sid
        self.seen = now
        self.results: list[WireResult] = []
        self.returned: list[tuple[str, int]] = []
        # turned away at the attempt limit: the link fails them
        self.given_up: list[tuple[str, int, str]] = []
        self.tokens = 0
        self.elapsed_s = 0.0
        self.occupied_s = 0.0              # elapsed_s x occupancy, summed
        self.partials: list[tuple[str, int, str]] = []      # streamed text not yet collected
        self.streamed: dict[RequestKey, int] = {}  # characters of each streamed request's text sent
        self.ready = asyncio.Event()

    def wake(self) -> None:
        self.ready.set()


class LinkSessions:
    """Implements AdmissionSource (forge/host/source.py) for the host's one engine."""

    def __init__(self, geometry: EngineGeometry, *, node: str, max_pending: int):
        self.geometry = geometry
        self.queue = HostQueue(geometry, node=node, max_pending=max_pending)
        self.sessions: dict[str, Session] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.healthy = True
        self.accepting = True

    # ------------------------------------------------------------------ links
    def session(self, sid: str) -> Optional[Session]:
        """The live session (opened on first use); None once it has ended."""
        s = self.sessions.get(sid)
        if s is None and sid not in self._ended:
            s = self.sessions[sid] = Session(sid, time.monotonic())
        if s is not None:
            s.seen = time.monotonic()
        return s

    def put(self, sid: str, reqs: list[HostRequest]) -> int:
        """Queue a link's batch; what cannot be queued goes straight back to it. Returns the count
        queued."""
        s = self.session(sid)
        if s is None:
            return 0
        queued = 0
        add = self.queue.add
        for r in reqs:
            if not (self.accepting and self.healthy):
                _turn_away(s, r)
                continue
            try:
                add(r)
                queued += 1
            except QueueFull:
                _turn_away(s, r)
            except NoEngineFits as e:  # the node measured against this geometry; say so if not
                s.results.append(wire_result(r.key, "error", [], "", None, str(e), 0))
        if s.returned or s.results or s.given_up:
            s.wake()
        return queued

    def end(self, sid: str) -> None:
        self.sessions.pop(sid, None)
        self._ended[sid] = None
        while len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)

    def expire(self, lease_s: float) -> list[str]:
        now = time.monotonic()
        gone = [sid for sid, s in self.sessions.items() if now - s.seen > lease_s]
        for sid in gone:
            self.end(sid)
        return gone

    def give_back_pending(self) -> None:
        """Everything queued here returns to its link (the engine is unhealthy or draining);
        admission never had it, so the attempt limit is applied here."""
        for r in self.queue.drain():
            s = self.sessions.get(r.key.session)
            if s is not None:
                _turn_away(s, r)
                s.streamed.pop(r.key, None)
                s.wake()

    def abandon(self, key: RequestKey) -> bool:
        """The node's caller left: a request still queued here is dropped by admission when
        taken."""
        r = self.queue.queued(key)
        if r is None:
            return False
        r.abandoned = True
        return True

    # ------------------------------------------------------------------ AdmissionSource
    async def take(
        self, *, free_slots: int, free_kv_blocks: int, timeout_s: float
    ) -> list[HostRequest]:
        batch = await self.queue.take(
            free_slots=free_slots, free_kv_blocks=free_kv_blocks, timeout_s=timeout_s
        )
        sessions = self.sessions
        live = [r for r in batch if r.key.session in sessions]
        if len(live) != len(batch):            # a job gone: nobody will collect these answers
            for r in batch:
                if r.key.session not in sessions:
                    self.queue.done(r)
        return live

    def requeue(self, reqs: list[HostRequest]) -> None:
        """Admission's give-backs, the attempt limit already applied (forge/host/outcomes.py)."""
        for r in reqs:
            self.queue.done(r)
            self._return(r)

    def on_done(self, req: HostRequest) -> None:
        self.queue.done(req)

    def record_delivery(self, tokens: int, elapsed_s: float, occupancy: float) -> None:
        """Tokens delivered over elapsed_s busy seconds with `occupancy` of the slots in use on
        average: each session passes the sum to its link's broker with the time-weighted mean
        occupancy."""
        for s in self.sessions.values():
            s.tokens += tokens
            s.elapsed_s += elapsed_s
            s.occupied_s += elapsed_s * occupancy

    def set_engine_healthy(self, healthy: bool) -> None:
        self.healthy = healthy
        self.queue.set_healthy(healthy)
        if not healthy:
            self.give_back_pending()
        for s in self.sessions.values():
            s.wake()                           # links learn the health change at once

    # ------------------------------------------------------------------ results
    def partial(self, req: HostRequest, ids: list[int], decode: Callable[[list[int]], str]) -> None:
        """A streamed request's output so far: the text beyond what was sent goes out with the next
        collect. A trailing U+FFFD is a character whose bytes are not all generated yet: it waits
        for them."""
        s = self.sessions.get(req.key.session)
        if s is None:
            return
        text = decode(ids).rstrip("\ufffd")
        sent = s.streamed.get(req.key, 0)
        if len(text) > sent:
            s.partials.append((req.key.rid, req.key.attempt, text[sent:]))
            s.streamed[req.key] = len(text)
            s.wake()

    def deliver(self, req: HostRequest, make_result: Callable[[], WireResult]) -> None:
        s = self.sessions.get(req.key.session)
        if s is not None:
            if s.streamed:
                s.streamed.pop(req.key, None)
            s.results.append(make_result())
            s.wake()

    def _return(self, r: HostRequest) -> None:
        s = self.sessions.get(r.key.session)
        if s is not None:
            s.returned.append((r.key.rid, r.key.attempt))
            s.streamed.pop(r.key, None)        # sent again as attempt + 1: its text starts over
            s.wake()

    async def collect(self, sid: str, wait_s: float, max_items: int) -> Optional[Collected]:
        """What is ready for a session, waiting up to wait_s for something; None if the session has
        ended. The host adds its health and stats."""
        s = self.session(sid)
        if s is None:
            return None
        if not (s.results or s.returned or s.partials or s.given_up):
            s.ready.clear()
            try:
                await asyncio.wait_for(s.ready.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        results, s.results = s.results[:max_items], s.results[max_items:]
        returned, s.returned = s.returned, []
        partials, s.partials = s.partials, []
        gone, s.given_up = s.given_up, []
        delivered = Delivered(
            s.tokens, s.elapsed_s, s.occupied_s / s.elapsed_s if s.elapsed_s > 0 else 1.0
        )
        s.tokens, s.elapsed_s, s.occupied_s = 0, 0.0, 0.0
        s.seen = time.monotonic()
        if partials or gone:
            return Collected(
                results, returned, delivered, bool(s.results), partials=partials, given_up=gone
            )
        return Collected(results, returned, delivered, bool(s.results))


def _turn_away(s: Session, r: HostRequest) -> None:
    """A request that never reached admission goes back to its link, or is given up at the attempt
    limit."""
    why = given_up("given back by the engine", r.key.attempt)
    if why is None:
        s.returned.append((r.key.rid, r.key.attempt))
    else:
        s.given_up.append((r.key.rid, r.key.attempt, why))
