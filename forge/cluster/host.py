"""One card's engine as a Ray actor (the node agent creates one per card, see agent.py).

Built exactly as on one machine: the node description is loaded and validated on the card's own machine,
the backend factory builds the engine from that card's contract and plan, and an AdmissionRuntime bounds
it by the contract's slots and KV pool. Job drivers move requests in batches: `submit` a list, `collect`
(a long poll) the finished ones. A failed engine ends this process so Ray restarts the actor on its card;
its in-flight requests are requeued by the drivers. Not importing Ray: the agent wraps this class."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import asdict, replace
from typing import Optional

from forge import constants
from forge.cluster import guard
from forge.cluster.feed import Feed
from forge.cluster.names import engine_id as cluster_engine_id
from forge.cluster.wire import from_wire, tokenizer_identity
from forge.errors import ForgeError

log = logging.getLogger("forge.cluster.host")

SESSION_LEASE_S = 60.0          # a job driver silent this long is gone; its work here is dropped
STATS_EVERY_S = 0.2             # an idle session's collect carries engine stats this often
FAILED_EXIT_DELAY_S = 1.0       # after an engine failure: let drivers collect what was given back, then exit
EXIT_ENGINE_FAILED = 4
MAX_PENDING_FACTOR = 4          # queued here at most this many times the engine's slots


class EngineHost:
    def __init__(self, node_path: str, card_index: int, agent: dict):
        # agent: the agent's pid and host (watched), the tier it expects on this card, and `guard` (False
        # only where this class runs outside a Ray worker, e.g. unit tests).
        self.guard = guard.install(agent.get("pid"), agent.get("host")) if agent.get("guard", True) else {}
        from forge.config.load import load_node
        from forge.runtime.admission import geometry_from_plan
        from forge.runtime.node import backend_factories

        loaded = load_node(node_path)
        plan = next((p for p in loaded.plans if p.card.index == card_index), None)
        if plan is None:
            raise ForgeError(f"{node_path}: no card with index {card_index} (the description changed under the agent)")
        if agent.get("tier") and plan.contract.contract != agent["tier"]:
            raise ForgeError(f"{node_path}: card {plan.card_id} now runs {plan.contract.contract}, not "
                             f"{agent['tier']} (the description changed under the agent; restart it)")
        factories = backend_factories()
        if plan.contract.backend not in factories:
            raise ForgeError(f"card {plan.card_id}: backend {plan.contract.backend!r} is not installed on "
                             f"{socket.gethostname()} (known: {', '.join(sorted(factories))})")
        t0 = time.monotonic()
        self.engine = factories[plan.contract.backend](plan.contract, plan)
        self.load_s = time.monotonic() - t0
        self.plan, self.node = plan, loaded.node.node
        self.tokenizer = self.engine.tokenizer
        self.tokenizer_key = tokenizer_identity(plan.contract, self.tokenizer)
        self.geometry = geometry_from_plan(plan, self.tokenizer_key)       # engine_id: the card id, locally
        self.engine_id = cluster_engine_id(self.node, plan.card_id)
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self.feed: Optional[Feed] = None
        self._rt = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._stats_sent: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle (on the actor's loop)
    def _ensure_running(self) -> None:
        if self._rt is not None:
            return
        from forge.runtime.admission import AdmissionRuntime

        g = self.geometry
        self.feed = Feed(g, node=self.node, max_pending=MAX_PENDING_FACTOR * g.max_batch_size)
        self._rt = AdmissionRuntime(engine=self.engine, plan=self.plan, broker=self.feed, node=self.node,
                                    deliver=self._deliver, tokenizer_key=self.tokenizer_key)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name=f"admission-{self.engine_id}"),
                       loop.create_task(self._expire(), name=f"sessions-{self.engine_id}")]

    async def _run(self) -> None:
        await self._rt.run()
        if self._rt.failure and not self._stopping:
            log.error("engine %s failed (%s); the actor exits so Ray restarts it", self.engine_id, self._rt.failure)
            await asyncio.sleep(FAILED_EXIT_DELAY_S)
            os._exit(EXIT_ENGINE_FAILED)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(SESSION_LEASE_S / 4)
            for sid in self.feed.expire(SESSION_LEASE_S):
                log.warning("engine %s: job session %s went silent; its work here is dropped", self.engine_id, sid)

    def _deliver(self, req, result) -> None:
        meta = req.payload

        def make() -> tuple:
            text = ""
            if not meta.want_hidden and result.finish_reason != "error" and not result.error:
                text = self.tokenizer.decode(result.output_ids)
            return (meta.rid, req.attempt, result.finish_reason, list(result.output_ids), text,
                    list(result.hidden) if result.hidden is not None else None, result.error,
                    len(req.prompt_for(self.tokenizer_key)))

        self.feed.deliver(req, make)

    # ------------------------------------------------------------------ what drivers and agents call
    async def hello(self) -> dict:
        self._ensure_running()
        g = replace(self.geometry, engine_id=self.engine_id)
        card = self.plan.card
        return {"engine_id": self.engine_id, "incarnation": self.incarnation, "node": self.node,
                "card": self.plan.card_id, "model": card.model, "tier": self.plan.contract.contract,
                "backend": self.plan.contract.backend, "geometry": asdict(g), "host": socket.gethostname(),
                "pid": os.getpid(), "ray_node_id": _ray_node_id(),
                "load_s": round(self.load_s, 2), "started_at": self.started_at, "guard": self.guard,
                "engine": self.engine.describe(), "stats": self._rt.stats()}

    async def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(self.tokenizer.encode(t)) for t in texts]

    async def submit(self, sid: str, items: list[tuple]) -> int:
        self._ensure_running()
        now = time.monotonic()
        return self.feed.put(sid, [from_wire(it, sid, self.tokenizer_key, now) for it in items])

    async def collect(self, sid: str, wait_s: float, max_items: int = 4096) -> dict:
        self._ensure_running()
        out = await self.feed.collect(sid, wait_s, max_items)
        if out is None:
            return {"ended": True, "incarnation": self.incarnation}
        out.update(healthy=self.feed.healthy, accepting=self.feed.accepting, incarnation=self.incarnation)
        now = time.monotonic()       # stats ride with every answer (so a job's last numbers are exact), else rarely
        if out["results"] or out["returned"] or now - self._stats_sent.get(sid, 0.0) >= STATS_EVERY_S:
            self._stats_sent[sid] = now
            out["stats"] = self._rt.stats()
        return out

    async def end_session(self, sid: str) -> None:
        if self.feed is not None:
            self.feed.end(sid)
        self._stats_sent.pop(sid, None)

    async def stats(self):
        self._ensure_running()
        return self._rt.stats()

    async def drain(self, timeout_s: float) -> bool:
        """Take nothing new (queued work goes back to its drivers), let in-flight work finish and be
        collected, bounded by timeout_s. True when nothing was cut short."""
        self._ensure_running()
        self.feed.accepting = False
        self.feed.give_back_pending()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = self._rt.stats().in_flight or any(s.results or s.returned for s in self.feed.sessions.values())
            if not busy:
                return True
            await asyncio.sleep(0.05)
        return False

    async def stop(self) -> None:
        """Give every in-flight request back to its driver and shut the engine down."""
        self._stopping = True
        if self._rt is None:
            self.engine.shutdown(constants.ENGINE_SHUTDOWN_TIMEOUT_S)
            return
        self.feed.accepting = False
        self.feed.give_back_pending()
        await self._rt.stop()


def _ray_node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except ImportError:
        return ""
