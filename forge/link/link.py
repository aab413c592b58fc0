"""A node's link to one engine host: batches out, batches back, loss and return.

Sender: takes from the node's broker what fits the engine's credit (credit.py) and submits it in one
call. Collector: a long poll that returns finished requests, requests the engine gave back, the
engine's delivered tokens (the broker's balancing signal), its health, state and stats.

Loss: any failed call, a reply from another incarnation, an ended session or a failed engine means
the host may have lost what it held. Every request dispatched to it is requeued to the broker (or
fails, past the attempt limit) and the engine is marked unhealthy; a dispatch is identified by
(request id, attempt), so an answer that arrives later from the old incarnation (or an orphan) is
ignored: each request is settled once. The transport then brings the host back
(forge/link/transport.py) and the link takes it back when it answers with the same geometry, or
gives it up for good (state "gone")."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Callable, Optional

from forge import constants
from forge.broker import BrokerClosed, BrokerRequest
from forge.host.protocol import (
    STATS_INTERVAL_S,
    Collected,
    Hello,
    WireRequest,
    WireResult,
    given_up,
)
from forge.link.counters import JobCounters
from forge.link.credit import Credit
from forge.link.transport import LinkGone, Transport
from forge.link.wire import to_wire
from forge.stats import EngineStats

log = logging.getLogger("forge.link")

STATS_CALL_TIMEOUT_S = 5.0   # a stats read the link waits for at most this long
# How old the host's counters may be when read: its driver samples the engine every
# STATS_INTERVAL_S.
HOST_STATS_LAG_S = 2 * STATS_INTERVAL_S
COLLECT_WAIT_S = 0.5         # long-poll length (a collect returns as soon as something is ready)
# beyond its own wait, any call to a host: silence this long is a lost engine, as a stalled card is
# in an embedded run
CALL_TIMEOUT_S = constants.STALL_WINDOW_S
TAKE_WAIT_S = 0.25
MAX_ITEMS = 4096
CLOSE_WAIT_S = 5.0
_sessions = itertools.count(1)


class EngineLink:
    def __init__(
        self,
        transport: Transport,
        info: Hello,
        *,
        broker,
        rid_prefix: str,
        settle: Callable[[BrokerRequest, str, WireResult], None],
        fail: Callable[[BrokerRequest, str], None],
        wanted: Optional[Callable[[BrokerRequest], bool]] = None,
        progress: Optional[Callable[[BrokerRequest, int, str], None]] = None,
    ):
        """settle(request, engine id, result) and fail(request, why) answer the node's callers;
        wanted(request) False means its caller left, so it is not sent (the broker still counts it
        done)."""
        self.transport, self.info = transport, info
        self.geometry = info.geometry
        self.eid = self.geometry.engine_id
        self.key = self.geometry.tokenizer_key
        self.broker, self._settle, self._fail, self._wanted = broker, settle, fail, wanted
        # the node's request-id prefix; this link's session ids begin with it too
        self.rid_prefix = rid_prefix
        # progress(request, attempt, text): a streamed request's next piece of output
        self._progress = progress
        self.credit = Credit(self.geometry)
        self.out = self.credit.out  # rid -> (request, attempt, blocks): dispatched, not answered
        self.session = self._new_session()
        self.incarnation = info.incarnation
        self.epoch = 0
        self.state = "up"  # up | down (being brought back) | gone (not used any more)
        self.down_since: Optional[float] = None
        self.healthy = True
        # the host's admission state (running, stalled, wedged, failed, ...)
        self.engine_state = "running"
        self.failure: Optional[str] = None          # why the engine is gone for good
        self.lost_reason = ""                       # why it was last lost
        self.unhealthy_since: Optional[float] = None
        self.draining = False
        self.lost_requeued = 0
        self.dropped_cancelled = 0  # taken for this engine after their callers left: never sent
        self.counters = JobCounters()
        self.counters.observe(info.stats)          # counted from here: a host may outlive a job
        self._cancels: list[tuple[str, int]] = []
        self._cancel_flush: Optional[asyncio.Handle] = None
        self._closed = False
        self._up = asyncio.Event()
        self._up.set()
        self._credit = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def _new_session(self) -> str:
        return f"{self.rid_prefix}-{next(_sessions)}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._spawn(self._send_loop(), f"send-{self.eid}")
        self._spawn(self._collect_loop(), f"collect-{self.eid}")

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._closed = True  # the loops end at their next turn even if a cancel is lost
        self._up.set()
        self._credit.set()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(list(self._tasks), timeout=CLOSE_WAIT_S)
            if stuck:
                log.error(
                    "engine %s: %d link task(s) did not end within %g s",
                    self.eid,
                    len(stuck),
                    CLOSE_WAIT_S,
                )
        if self.state == "up":
            try:
                await self.transport.end_session(self.session, timeout_s=5.0)
            except Exception:  # noqa: BLE001 - the host ends the session by its lease anyway
                pass

    def stats(self) -> Optional[EngineStats]:
        return self.counters.view(
            self.lost_requeued, self.state == "up" and self.healthy, self.dropped_cancelled
        )

    async def read_stats(self) -> Optional[EngineStats]:
        """stats(), with the host's counters read now (one call) instead of as its last collect
        reply carried them (an idle link's replies come one long-poll apart); as last reported when
        the host does not answer."""
        if self.state == "up":
            try:
                self.counters.observe(await self.transport.stats(timeout_s=STATS_CALL_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - a host that cannot answer now: its last report stands
                pass
        return self.stats()

    def idle(self) -> bool:
        """Nothing dispatched here is still owed an answer."""
        return not self.out

    # ------------------------------------------------------------------ sending
    async def _send_loop(self) -> None:
        while not self._closed:
            await self._up.wait()
            if self.draining or self._closed:
                return
            if not self._has_credit():
                self._credit.clear()
                try:
                    await asyncio.wait_for(self._credit.wait(), TAKE_WAIT_S)
                except asyncio.TimeoutError:
                    pass
                continue
            epoch = self.epoch
            try:
                batch = self._keep(
                    await self.broker.take(
                        self.eid,
                        free_slots=self.credit.free_slots(),
                        free_kv_blocks=self.credit.free_blocks(),
                        timeout_s=TAKE_WAIT_S,
                    )
                )
                if not batch:
                    continue
                while self._has_credit():  # top up: one call carries as much as the engine may hold
                    more = self._keep(
                        await self.broker.take(
                            self.eid,
                            free_slots=self.credit.free_slots(),
                            free_kv_blocks=self.credit.free_blocks(),
                            timeout_s=0,
                        )
                    )
                    if not more:
                        break
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
                await self.transport.submit(self.session, wire, timeout_s=CALL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure to hand over is a loss
                self.lost(f"submit failed: {type(e).__name__}: {_first_line(e)}", epoch)

    def _to_wire(self, batch: list[BrokerRequest]) -> list[WireRequest]:
        """The batch as it travels; a request that cannot be put on the wire fails alone (its future
        must end)."""
        now, wire = time.monotonic(), []
        for r in batch:
            try:
                wire.append(to_wire(r, self.key, now))
            except Exception as e:  # noqa: BLE001 - that request's fault, not the link's
                if self._release(r.request_id, r.attempt) is not None:
                    self.broker.on_done(self.eid, r)
                    self._fail(r, f"request cannot be sent to engine {self.eid}: "
                                  f"{type(e).__name__}: {e}")
        return wire

    def _keep(self, batch: list[BrokerRequest]) -> list[BrokerRequest]:
        """Reserve credit for the requests whose callers still wait; the others are done with."""
        wanted, reserve, kept = self._wanted, self.credit.reserve, []
        for r in batch:
            if wanted is not None and not wanted(r):
                self.broker.on_done(self.eid, r)
                self.dropped_cancelled += 1
                continue
            reserve(r)
            kept.append(r)
        return kept

    def _has_credit(self) -> bool:
        return self.healthy and self.credit.left()

    def _release(self, rid: str, attempt: int) -> Optional[BrokerRequest]:
        req = self.credit.release(rid, attempt)
        if req is not None:
            self._credit.set()
        return req

    # ------------------------------------------------------------------ cancelling
    def cancel(self, rid: str) -> bool:
        """The caller of `rid` left. If it was dispatched here, the host stops it (batched with
        others); its answer (cancelled) still comes back and frees the credit. False when it is not
        here."""
        attempt = self.credit.attempt_of(rid)
        if attempt is None or self.state != "up":
            return False
        self._cancels.append((rid, attempt))
        if self._cancel_flush is None:
            self._cancel_flush = asyncio.get_running_loop().call_soon(self._flush_cancels)
        return True

    def _flush_cancels(self) -> None:
        self._cancel_flush = None
        keys, self._cancels = self._cancels, []
        if keys:
            self._spawn(self._send_cancels(keys, self.session), f"cancel-{self.eid}")

    async def _send_cancels(self, keys: list[tuple[str, int]], session: str) -> None:
        try:
            await self.transport.cancel(session, keys, timeout_s=CALL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - a lost host gives everything back anyway
            log.debug(
                "engine %s: cancel of %d request(s) not delivered: %s", self.eid, len(keys), e
            )

    # ------------------------------------------------------------------ collecting
    async def _collect_loop(self) -> None:
        while not self._closed:
            await self._up.wait()
            if self._closed:
                return
            epoch, sid = self.epoch, self.session
            try:
                reply = await self.transport.collect(sid, COLLECT_WAIT_S, MAX_ITEMS,
                                                     timeout_s=COLLECT_WAIT_S + CALL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                self.lost(f"{type(e).__name__}: {_first_line(e)}", epoch)
                continue
            if epoch == self.epoch and not self._closed:
                try:
                    self._apply(reply, epoch)
                except Exception as e:  # noqa: BLE001 - a reply forge cannot read: the engine's work is as lost
                    self.lost(f"unreadable reply: {type(e).__name__}: {_first_line(e)}", epoch)

    def _apply(self, reply: Collected, epoch: int) -> None:
        if reply.ended:
            self.lost("the engine ended this link's session", epoch)
            return
        if reply.incarnation != self.incarnation:
            self.lost(f"the engine restarted (incarnation {reply.incarnation})", epoch)
            return
        # before the results: a piece precedes its end
        if reply.partials and self._progress is not None:
            out, progress = self.out, self._progress
            for rid, attempt, text in reply.partials:
                held = out.get(rid)
                # the dispatch the node waits on, not a lost one
                if held is not None and held[1] == attempt:
                    progress(held[0], attempt, text)
        results = reply.results
        if results:  # one collect's answers: the broker's books and the credit event once for all
            release, done = self.credit.release, []
            for res in results:
                req = release(res.rid, res.attempt)
                if req is not None:
                    done.append((req, res))
            if done:
                self._credit.set()
                self.broker.on_done_many(self.eid, [req for req, _ in done])
                settle, eid = self._settle, self.eid
                for req, res in done:
                    settle(req, eid, res)
        back = [
            req
            for rid, attempt in reply.returned
            if (req := self._release(rid, attempt)) is not None
        ]
        if back:  # the host applied the attempt limit to what it gave back: these go again
            self.broker.requeue(back)
        for rid, attempt, why in reply.given_up:
            req = self._release(rid, attempt)
            if req is not None:
                self.broker.on_done(self.eid, req)
                self._fail(req, why)
        delivered = reply.delivered
        if delivered.tokens:
            self.broker.record_delivery(
                self.eid, delivered.tokens, delivered.elapsed_s, delivered.occupancy
            )
        if reply.stats is not None:
            self.counters.observe(reply.stats)
        self.engine_state = reply.state or self.engine_state
        if reply.failure:
            self.failure = reply.failure
            self.lost(reply.failure, epoch, engine_failed=True)
            return
        healthy = bool(reply.healthy and reply.accepting)
        if healthy != self.healthy:
            self.healthy = healthy
            self.unhealthy_since = None if healthy else time.monotonic()
            self.broker.set_engine_healthy(self.eid, healthy)
            self._credit.set()

    # ------------------------------------------------------------------ loss and return
    def lost(self, reason: str, epoch: int, *, engine_failed: bool = False) -> None:
        if epoch != self.epoch or self.state != "up":
            return
        self.epoch += 1
        self.state, self.down_since, self.lost_reason = "down", time.monotonic(), reason
        self._up.clear()
        self.broker.set_engine_healthy(self.eid, False)
        reqs = self.credit.clear()
        self._cancels.clear()
        self.lost_requeued += len(reqs)
        log.warning(
            "engine %s lost (%s): %d in-flight request(s) go back to the broker",
            self.eid,
            reason,
            len(reqs),
        )
        self._requeue(reqs, f"engine {self.eid} was lost ({reason})")
        self._spawn(self._reattach(reason, engine_failed, self.incarnation), f"reattach-{self.eid}")

    def _lost_batch(self, batch: list[BrokerRequest]) -> None:
        reqs = [r for r in batch if self._release(r.request_id, r.attempt) is not None]
        self._requeue(reqs, f"engine {self.eid} was lost")

    def _requeue(self, reqs: list[BrokerRequest], reason: str) -> None:
        """Lost with the host (which can no longer say): back to the broker, or given up at the
        attempt limit."""
        back = []
        for r in reqs:
            why = given_up(reason, r.attempt)
            if why is not None:
                self.broker.on_done(self.eid, r)
                self._fail(r, why)
            else:
                back.append(r)
        if back:
            self.broker.requeue(back)

    async def _reattach(self, why: str, engine_failed: bool, incarnation: str) -> None:
        try:
            info = await self.transport.reconnect(
                why, engine_failed=engine_failed, incarnation=incarnation
            )
        except LinkGone as e:
            self.state = "gone"
            self.failure = self.failure or str(e)
            log.error("engine %s is given up: %s", self.eid, e)
            return
        if info.geometry != self.geometry:
            log.error(
                "engine %s came back with a different contract geometry; it is not used", self.eid
            )
            self.state, self.failure = "gone", "came back with a different contract geometry"
            return
        old, self.session = self.session, self._new_session()
        if info.incarnation != self.incarnation:
            self.counters.new_incarnation()
            self.counters.observe(info.stats)
        else:
            self._spawn(self._end_session(old), f"end-{self.eid}")
        self.info, self.incarnation = info, info.incarnation
        self.state, self.down_since, self.healthy, self.failure = "up", None, True, None
        self.unhealthy_since = None
        self.engine_state = "running"
        self.broker.set_engine_healthy(self.eid, True)
        self._up.set()
        self._credit.set()
        log.warning("engine %s is back (incarnation %s)", self.eid, self.incarnation)

    async def _end_session(self, sid: str) -> None:
        try:
            await self.transport.end_session(sid, timeout_s=5.0)
        except Exception:  # noqa: BLE001 - it ends by its lease anyway
            pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
