"""A job driver's link to one engine actor: batches out, batches back, loss and return.

Sender: takes from the job's broker what fits the engine's credit (its contract's slots and KV blocks,
times CREDIT_FACTOR so the next batch is already there when a slot frees) and submits it in one Ray call.
Collector: a long poll that returns finished requests, requests the engine gave back, the engine's
delivered tokens (the broker's balancing signal), its health and its stats.

Loss: any failed call, a reply from another incarnation, or an ended session means the engine may have lost
what it held. Every request dispatched to it is requeued to the broker (or fails, past the attempt limit)
and the engine is marked unhealthy; a dispatch is identified by (request id, attempt), so an answer that
arrives later from the old incarnation (or an orphan) is ignored: each request is settled once. The link
then polls the actor (Ray may restart it on its card) or the actor's name (a re-provisioned node), and
takes the engine back when it answers with the same geometry."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable, Optional

from forge import constants
from forge.broker import BrokerClosed, BrokerRequest, EngineGeometry, blocks_needed
from forge.cluster.counters import JobCounters
from forge.cluster.names import NAMESPACE
from forge.cluster.wire import to_wire
from forge.stats import EngineStats

log = logging.getLogger("forge.cluster.links")

CREDIT_FACTOR = 1.25         # in flight + queued at an engine, relative to its contract's slots and KV blocks
COLLECT_WAIT_S = 0.5         # long-poll length (a collect returns as soon as something is ready)
CALL_TIMEOUT_S = constants.STALL_WINDOW_S   # beyond its own wait, any call to an engine actor: silence this long
                                            # is a lost engine, as a stalled card is in an embedded run
HELLO_TIMEOUT_S = 10.0
REATTACH_INTERVAL_S = 0.5
TAKE_WAIT_S = 0.25
MAX_ITEMS = 4096
_sessions = itertools.count(1)


def geometry_of(info: dict) -> EngineGeometry:
    return EngineGeometry(**info["geometry"])


class EngineLink:
    def __init__(self, name: str, handle: Any, info: dict, *, broker, job: str,
                 settle: Callable[[BrokerRequest, str, tuple], None], fail: Callable[[BrokerRequest, str], None]):
        self.name, self.handle, self.info = name, handle, info
        self.geometry = geometry_of(info)
        self.eid = self.geometry.engine_id
        self.key = self.geometry.tokenizer_key
        self.broker, self.job, self._settle, self._fail = broker, job, settle, fail
        self.cap_slots = max(1, int(self.geometry.max_batch_size * CREDIT_FACTOR))
        self.cap_blocks = max(1, int(self.geometry.kv_blocks_total * CREDIT_FACTOR))
        self.out: dict[str, tuple[BrokerRequest, int, int]] = {}     # rid -> (request, attempt, blocks)
        self.used_slots = self.used_blocks = 0
        self.session = self._new_session()
        self.incarnation = info["incarnation"]
        self.epoch = 0
        self.state = "up"                 # up | down | gone (came back different: not used by this job)
        self.down_since: Optional[float] = None
        self.healthy = True
        self.lost_requeued = 0
        self.counters = JobCounters()
        self.counters.observe(info["stats"])       # the job counts from here: engines outlive jobs
        self._up = asyncio.Event()
        self._up.set()
        self._credit = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _new_session(self) -> str:
        return f"{self.job}-{next(_sessions)}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._send_loop(), name=f"send-{self.eid}"),
                       asyncio.create_task(self._collect_loop(), name=f"collect-{self.eid}")]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.state == "up":
            try:
                await asyncio.wait_for(self.handle.end_session.remote(self.session), 5.0)
            except Exception:  # noqa: BLE001 - the engine will end the session by its lease anyway
                pass

    def stats(self) -> Optional[EngineStats]:
        return self.counters.view(self.lost_requeued, self.state == "up" and self.healthy)

    # ------------------------------------------------------------------ sending
    async def _send_loop(self) -> None:
        while True:
            await self._up.wait()
            if not self._has_credit():
                self._credit.clear()
                try:
                    await asyncio.wait_for(self._credit.wait(), TAKE_WAIT_S)
                except asyncio.TimeoutError:
                    pass
                continue
            epoch = self.epoch
            try:
                batch = await self.broker.take(self.eid, free_slots=self.cap_slots - self.used_slots,
                                               free_kv_blocks=self.cap_blocks - self.used_blocks, timeout_s=TAKE_WAIT_S)
                if not batch:
                    continue
                self._reserve(batch)
                while self._has_credit():     # top up: one Ray call carries as much as the engine may hold
                    more = await self.broker.take(self.eid, free_slots=self.cap_slots - self.used_slots,
                                                  free_kv_blocks=self.cap_blocks - self.used_blocks, timeout_s=0)
                    if not more:
                        break
                    self._reserve(more)
                    batch += more
            except BrokerClosed:
                return
            if epoch != self.epoch:           # lost while taking: give these back too
                self._lost_batch(batch)
                continue
            wire = self._to_wire(batch)
            if not wire:
                continue
            try:
                await asyncio.wait_for(self.handle.submit.remote(self.session, wire), CALL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure to hand over is a loss
                self.lost(f"submit failed: {type(e).__name__}: {_first_line(e)}", epoch)

    def _to_wire(self, batch: list[BrokerRequest]) -> list[tuple]:
        """The batch as it travels; a request that cannot be put on the wire fails alone (its future must end)."""
        now, wire = time.monotonic(), []
        for r in batch:
            try:
                wire.append(to_wire(r, self.key, now))
            except Exception as e:  # noqa: BLE001 - that request's fault, not the link's
                if self._release(r.request_id, r.attempt) is not None:
                    self.broker.on_done(self.eid, r)
                    self._fail(r, f"request cannot be sent to engine {self.eid}: {type(e).__name__}: {e}")
        return wire

    def _has_credit(self) -> bool:
        return self.used_slots < self.cap_slots and self.used_blocks < self.cap_blocks and self.healthy

    def _reserve(self, batch: list[BrokerRequest]) -> None:
        for r in batch:
            b = blocks_needed(r, self.geometry)
            self.out[r.request_id] = (r, r.attempt, b)
            self.used_slots += 1
            self.used_blocks += b

    def _release(self, rid: str, attempt: int) -> Optional[BrokerRequest]:
        entry = self.out.get(rid)
        if entry is None or entry[1] != attempt:
            return None                       # not a dispatch we wait on (stale incarnation, orphan, duplicate)
        del self.out[rid]
        self.used_slots -= 1
        self.used_blocks -= entry[2]
        self._credit.set()
        return entry[0]

    # ------------------------------------------------------------------ collecting
    async def _collect_loop(self) -> None:
        while True:
            await self._up.wait()
            epoch, sid = self.epoch, self.session
            try:
                reply = await asyncio.wait_for(self.handle.collect.remote(sid, COLLECT_WAIT_S, MAX_ITEMS),
                                               COLLECT_WAIT_S + CALL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                self.lost(f"{type(e).__name__}: {_first_line(e)}", epoch)
                continue
            if epoch == self.epoch:
                try:
                    self._apply(reply, epoch)
                except Exception as e:  # noqa: BLE001 - a reply forge cannot read: the engine's work is as lost
                    self.lost(f"unreadable reply: {type(e).__name__}: {_first_line(e)}", epoch)

    def _apply(self, reply: dict, epoch: int) -> None:
        if reply.get("ended"):
            self.lost("the engine ended this job's session", epoch)
            return
        if reply["incarnation"] != self.incarnation:
            self.lost(f"the engine restarted (incarnation {reply['incarnation']})", epoch)
            return
        for res in reply["results"]:
            req = self._release(res[0], res[1])
            if req is not None:
                self.broker.on_done(self.eid, req)
                self._settle(req, self.eid, res)
        back = [req for rid, attempt in reply["returned"] if (req := self._release(rid, attempt)) is not None]
        if back:
            self._requeue(back, "given back by the engine")
        tokens, elapsed = reply["delivered"]
        if tokens:
            self.broker.record_delivery(self.eid, tokens, elapsed)
        healthy = bool(reply["healthy"] and reply["accepting"])
        if healthy != self.healthy:
            self.healthy = healthy
            self.broker.set_engine_healthy(self.eid, healthy)
            self._credit.set()
        if "stats" in reply:
            self.counters.observe(reply["stats"])

    # ------------------------------------------------------------------ loss and return
    def lost(self, reason: str, epoch: int) -> None:
        if epoch != self.epoch or self.state != "up":
            return
        self.epoch += 1
        self.state, self.down_since = "down", time.monotonic()
        self._up.clear()
        self.broker.set_engine_healthy(self.eid, False)
        reqs = [r for r, _, _ in self.out.values()]
        self.out.clear()
        self.used_slots = self.used_blocks = 0
        self.lost_requeued += len(reqs)
        log.warning("engine %s lost (%s): %d in-flight request(s) go back to the broker", self.eid, reason, len(reqs))
        self._requeue(reqs, f"engine {self.eid} was lost ({reason})")
        self._tasks.append(asyncio.create_task(self._reattach(), name=f"reattach-{self.eid}"))

    def _lost_batch(self, batch: list[BrokerRequest]) -> None:
        reqs = [r for r in batch if self._release(r.request_id, r.attempt) is not None]
        self._requeue(reqs, f"engine {self.eid} was lost")

    def _requeue(self, reqs: list[BrokerRequest], reason: str) -> None:
        back = []
        for r in reqs:
            if r.attempt >= constants.REQUEST_ATTEMPT_LIMIT:
                self.broker.on_done(self.eid, r)
                self._fail(r, f"{reason}; gave up after {r.attempt + 1} attempts")
            else:
                back.append(r)
        if back:
            self.broker.requeue(back)

    async def _reattach(self) -> None:
        died = _actor_died_error()
        while self.state == "down":
            await asyncio.sleep(REATTACH_INTERVAL_S)
            handle = self.handle
            try:
                info = await asyncio.wait_for(handle.hello.remote(), HELLO_TIMEOUT_S)
            except died:
                try:                          # its node may have been provisioned again: same name, new actor
                    import ray

                    handle = await asyncio.to_thread(ray.get_actor, self.name, namespace=NAMESPACE)
                    info = await asyncio.wait_for(handle.hello.remote(), HELLO_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - not (yet) there
                    continue
            except Exception:  # noqa: BLE001 - unavailable, restarting, slow: try again
                continue
            if geometry_of(info) != self.geometry:
                log.error("engine %s came back with a different contract geometry; this job does not use it", self.eid)
                self.state = "gone"
                return
            old, self.session = self.session, self._new_session()
            handle.end_session.remote(old)
            self.handle, self.info = handle, info
            if info["incarnation"] != self.incarnation:
                self.counters.new_incarnation()
                self.counters.observe(info["stats"])
            self.incarnation = info["incarnation"]
            self.state, self.down_since, self.healthy = "up", None, True
            self.broker.set_engine_healthy(self.eid, True)
            self._up.set()
            self._credit.set()
            log.warning("engine %s is back (incarnation %s)", self.eid, self.incarnation)


def _actor_died_error() -> type:
    """Ray's "this actor is gone for good" error (a class nothing raises where Ray is absent)."""
    try:
        import ray

        return ray.exceptions.ActorDiedError
    except ImportError:
        return type("NoActorDiedError", (Exception,), {})


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
