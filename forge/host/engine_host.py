"""One card's engine host: the engine, built from that card's contract and plan, behind its
admission runtime.

The host is what a link talks to, whatever carries the calls (forge/link/: a worker process, a
thread of the node's own process, a Ray actor). Links move requests in batches: `submit` a list of
WireRequests, `collect` (a long poll) the finished ones, the ones given back, delivery counts,
health and stats. Every method is a coroutine on the host's event loop; forge/host/protocol.py
declares them (HostMethod) and the records they take and return.

A host's identity is (card, replica): a card with `replicas: N` runs N hosts, one engine each (the
plan of one replica, forge/config/plan.py::engine_plans). `engine_id` is what the node's broker,
metrics and Generation.card call it: the card id on one machine (`cpu0.r1` for a card's replica 1),
node/card on a cluster."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Optional

from forge import constants
from forge.config.plan import CardPlan
from forge.errors import ForgeError, engine_failed_to_start
from forge.engines.interface import RequestKey
from forge.host.admission import CardAdmission, geometry_from_plan
from forge.host.link_sessions import LinkSessions
from forge.host.protocol import Collected, Hello, WireResult
from forge.host.request import HostRequest
from forge.host.wire import from_wire, tokenizer_identity, wire_result
from forge.requests import REFUSED
from forge.stats import EngineStats

log = logging.getLogger("forge.host")

STATS_EVERY_S = 0.2             # an idle session's collect carries engine stats this often
MAX_PENDING_FACTOR = 4          # queued here at most this many times the engine's slots


def build_engine(plan: CardPlan) -> Any:
    """The card's engine, built by its backend's factory from exactly its contract and plan."""
    from forge.backends import factory

    make = factory(plan.contract.backend, card=plan.engine_id)
    try:
        return make(plan.contract, plan)
    except ForgeError:
        raise
    except Exception as e:  # noqa: BLE001 - a factory's failure is the card's, in one line
        raise engine_failed_to_start(plan.engine_id, plan.contract.contract, e) from e


class EngineHost:
    def __init__(
        self,
        plan: CardPlan,
        *,
        node: str,
        engine_id: Optional[str] = None,
        stall_window_s: float = constants.STALL_WINDOW_S,
        node_tokenizer: Callable[[Any], Any] = None,
        session_lease_s: Optional[float] = constants.SESSION_LEASE_S,
    ):
        """Builds the engine (blocking: call it off any event loop that must stay responsive).
        node_tokenizer turns the engine's tokenizer into what `tokenizer_copy()` hands a node
        (default: the tokenizer itself). session_lease_s: a link session silent this long is
        dropped; None where the node's death is seen otherwise (a worker process: end of file on its
        socket, its parent gone) and silence only means the node's loop is busy, which must not cost
        the node its work here (a function blocking the node's loop for minutes)."""
        t0 = time.monotonic()
        self.engine = build_engine(plan)
        self.load_s = time.monotonic() - t0
        self.plan, self.node, self.replica = plan, node, plan.replica or 0
        self.stall_window_s = stall_window_s
        self.tokenizer = self.engine.tokenizer
        self.tokenizer_key = tokenizer_identity(plan.contract, self.tokenizer)
        # engine_id: card id, or card.rN
        self.geometry = geometry_from_plan(plan, self.tokenizer_key, self.engine)
        self.engine_id = engine_id or plan.engine_id
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self._node_tokenizer = node_tokenizer
        self.session_lease_s = session_lease_s
        self.link_sessions: Optional[LinkSessions] = None
        self._rt: Optional[CardAdmission] = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.stopped = False
        self.lifeline: dict = {}  # how this host's process dies with its parent (reported by hello)
        self._stats_sent: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle (on the host's
    # loop)
    def _ensure_running(self) -> None:
        if self._rt is not None:
            return
        g = self.geometry
        self.link_sessions = LinkSessions(
            g, node=self.node, max_pending=MAX_PENDING_FACTOR * g.max_batch_size
        )
        self._rt = CardAdmission(
            engine=self.engine,
            plan=self.plan,
            source=self.link_sessions,
            node=self.node,
            deliver=self._deliver,
            partial=self._partial,
            tokenizer_key=self.tokenizer_key,
            stall_window_s=self.stall_window_s,
        )
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name=f"admission-{self.engine_id}")]
        if self.session_lease_s is not None:
            self._tasks.append(
                loop.create_task(
                    self._expire(self.session_lease_s), name=f"sessions-{self.engine_id}"
                )
            )

    async def _run(self) -> None:
        await self._rt.run()
        if self._rt.failure and not self._stopping:
            self.on_engine_failed(self._rt.failure)

    def on_engine_failed(self, why: str) -> None:
        """The engine is gone and its work went back to the links, which see the failure in their
        next collect. Nothing more here; the Ray actor ends its process instead, so that Ray
        restarts it."""

    async def _expire(self, lease_s: float) -> None:
        while True:
            await asyncio.sleep(lease_s / 4)
            for sid in self.link_sessions.expire(lease_s):
                log.warning(
                    "engine %s: link session %s went silent; its work here is dropped",
                    self.engine_id,
                    sid,
                )

    def _deliver(self, req: HostRequest, result) -> None:
        def make() -> WireResult:
            finish, error, text = result.finish_reason, result.error, ""
            if finish not in ("error", REFUSED) and not error and not req.options.want_hidden:
                text = self.tokenizer.decode(result.output_ids)
            return wire_result(
                req.key, finish, result.output_ids, text, result.hidden, error, len(req.prompt)
            )

        self.link_sessions.deliver(req, make)

    def _partial(self, req: HostRequest, ids: list[int]) -> None:
        """A streamed request's output so far: its text goes to the link in pieces
        (LinkSessions.partial)."""
        self.link_sessions.partial(req, ids, self.tokenizer.decode)

    # ------------------------------------------------------------------ the protocol (HostMethod:
    # what links call)
    async def hello(self) -> Hello:
        self._ensure_running()
        p, card = self.plan, self.plan.card
        return Hello(
            engine_id=self.engine_id,
            incarnation=self.incarnation,
            node=self.node,
            card=p.card_id,
            replica=self.replica,
            model=card.model,
            tier=p.contract.contract,
            backend=p.contract.backend,
            geometry=replace(self.geometry, engine_id=self.engine_id),
            host=socket.gethostname(),
            pid=os.getpid(),
            load_s=round(self.load_s, 2),
            started_at=self.started_at,
            limits=p.contract.limits.model_dump(),
            kv_blocks=p.num_blocks,
            full_length_slots=p.full_length_slots,
            guides=sorted(self.engine.supports_guides),
            hidden=bool(self.engine.supports_hidden),
            engine=self.engine.describe(),
            lifeline=self.lifeline,
            gc=_collector(),
            stats=self._rt.stats(),
        )

    async def tokenizer_copy(self) -> tuple[Any, list[tuple[str, list[int]]]]:
        """The tokenizer a node measures with, and this engine's own encoding of a few probe texts
        (the node checks its copy against them before trusting it)."""
        probes = [(t, list(self.tokenizer.encode(t))) for t in PROBE_TEXTS]
        made = self._node_tokenizer(self.tokenizer) if self._node_tokenizer else self.tokenizer
        return made, probes

    async def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(self.tokenizer.encode(t)) for t in texts]

    async def submit(self, sid: str, items: list[tuple]) -> int:
        """items: WireRequests as plain tuples (protocol.requests_to_send); from_wire reads each in
        WireRequest's field order straight into the host's HostRequest (no WireRequest is built in
        between)."""
        self._ensure_running()
        now = time.monotonic()
        return self.link_sessions.put(
            sid, [from_wire(it, sid, self.tokenizer_key, now) for it in items]
        )

    async def collect(self, sid: str, wait_s: float, max_items: int = 4096) -> Collected:
        self._ensure_running()
        out = await self.link_sessions.collect(sid, wait_s, max_items)
        if out is None:
            return Collected.ended_session(self.incarnation)
        rt, stats = self._rt, None
        # stats ride with every answer (so a job's last numbers are exact), else rarely
        now = time.monotonic()
        if (
            out.results
            or out.returned
            or out.given_up
            or now - self._stats_sent.get(sid, 0.0) >= STATS_EVERY_S
        ):
            self._stats_sent[sid] = now
            stats = rt.stats()
        return replace(
            out,
            healthy=self.link_sessions.healthy,
            accepting=self.link_sessions.accepting,
            incarnation=self.incarnation,
            state=rt.state,
            failure=rt.failure,
            stats=stats,
        )

    async def cancel(self, sid: str, keys: list[tuple[str, int]]) -> int:
        """The node's callers left: stop these dispatches (rid, attempt), queued or running. Each is
        answered as cancelled through the session like any result. Returns how many were still
        here."""
        self._ensure_running()
        found = 0
        for rid, attempt in keys:
            key = RequestKey(sid, rid, attempt)
            if self._rt.cancel(key) or self.link_sessions.abandon(key):
                found += 1
        return found

    async def end_session(self, sid: str) -> None:
        if self.link_sessions is not None:
            self.link_sessions.end(sid)
        self._stats_sent.pop(sid, None)

    async def stats(self) -> EngineStats:
        self._ensure_running()
        return self._rt.stats()

    async def drain(self, timeout_s: float) -> bool:
        """Take nothing new (queued work goes back to its links), let in-flight work finish and be
        collected, bounded by timeout_s. True when nothing was cut short."""
        self._ensure_running()
        self.link_sessions.accepting = False
        self.link_sessions.give_back_pending()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = self._rt.stats().in_flight or any(s.results or s.returned or s.given_up
                                                    for s in self.link_sessions.sessions.values())
            if not busy:
                return True
            await asyncio.sleep(0.05)
        return False

    async def stop(self) -> None:
        """Give every in-flight request back to its link and shut the engine down."""
        self._stopping = True
        if self._rt is None:
            await asyncio.to_thread(self.engine.shutdown, constants.ENGINE_SHUTDOWN_TIMEOUT_S)
        else:
            self.link_sessions.accepting = False
            self.link_sessions.give_back_pending()
            await self._rt.stop()
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.stopped = True


def _collector() -> dict:
    """This process's cyclic-GC setting (forge/gc_tuning.py): a card worker freezes its loaded
    engine out of it."""
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}


# What the node's copy of a tokenizer must encode exactly as the engine's own does before it is
# trusted: plain words, leading and repeated spaces, newlines and tabs, digits, punctuation,
# accents, CJK, emoji.
PROBE_TEXTS = ("Hello, world!", "  two  spaces\nand a newline\tand a tab", "12345 + 678 = 13023",
               "Ünïcödé façade — naïve café", "日本語のテキスト", "emoji 🙂👍🏽", "<s> </s> <unk> [INST]", "")
