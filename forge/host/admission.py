"""Admission control around one engine's in-flight batcher (docs/admission.md explains the model).

Never more in flight than the contract's slots and KV pool (each request reserves ceil((input +
requested output) / tokens_per_block) blocks until the engine gives it back); a refusing engine is
retried with bounded backoff; a stall (work in flight, no token for a window) pauses admission (a
progress-only step) and then takes back the youngest requests, one at a time, so the oldest can
finish. Every request taken from the source (forge/host/source.py: the host's LinkSessions) is
delivered exactly once or given back."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Callable, Optional

from forge import constants
from forge.broker import EngineGeometry, blocks_for
from forge.config.plan import CardPlan
from forge.engines.interface import Engine, EngineRequest, EngineResult, IterationStats, RequestKey
from forge.host.driver import (
    Busy,
    DriverEvent,
    EngineDriver,
    Failed,
    Partials,
    Progressed,
    Sampled,
    Submitted,
)
from forge.host.flights import Flight, FlightTable
from forge.host.outcomes import Outcomes
from forge.host.progress import DeliveryRate, Occupancy, StallWatch
from forge.host.request import HostRequest
from forge.host.source import AdmissionSource
from forge.watchdogs.awake import pause_clock
from forge.stats import EngineStats

log = logging.getLogger("forge.host.admission")

TPS_HALF_LIFE_S = 2.0  # tokens_per_s EWMA: a delivery this long ago weighs half as much


def geometry_from_plan(
    plan: CardPlan, tokenizer_key: str = "default", engine: Optional[Engine] = None
) -> EngineGeometry:
    """The contract's geometry, with what the engine says of its own scheduling (the Engine class
    defaults without one)."""
    lim, e = plan.contract.limits, engine if engine is not None else Engine
    return EngineGeometry(
        engine_id=plan.engine_id,
        tokenizer_key=tokenizer_key,
        max_batch_size=lim.max_batch_size,
        max_num_tokens=lim.max_num_tokens,
        max_input_len=lim.max_input_len,
        max_output_len=lim.max_output_len,
        tokens_per_block=plan.contract.kv_cache.tokens_per_block,
        kv_blocks_total=plan.num_blocks,
        shares_prefix_within_step=bool(getattr(e, "shares_prefix_within_step", True)),
        output_classes_first=bool(getattr(e, "output_classes_first", True)),
        queue_slots=lim.max_batch_size if getattr(e, "queues_beyond_slots", False) else 0,
    )


class CardAdmission:
    def __init__(
        self,
        *,
        engine: Engine,
        plan: CardPlan,
        source: AdmissionSource,
        node: str,
        deliver: Callable[[HostRequest, EngineResult], None],
        tokenizer_key: str = "default",
        partial: Optional[Callable[[HostRequest, list[int]], None]] = None,
        stall_window_s: float = constants.STALL_WINDOW_S,
        poll_timeout_s: float = constants.ENGINE_POLL_TIMEOUT_S,
        takeback_interval_s: Optional[float] = None,
        shutdown_timeout_s: float = constants.ENGINE_SHUTDOWN_TIMEOUT_S,
    ):
        self.engine, self.plan, self.source, self.deliver = engine, plan, source, deliver
        self.partial = partial  # a streamed request's output so far (its ids), as it grows
        self.geometry = g = geometry_from_plan(plan, tokenizer_key, engine)
        self.engine_id = g.engine_id
        self.stall_window_s = stall_window_s
        self.takeback_interval_s = (
            stall_window_s / 10 if takeback_interval_s is None else takeback_interval_s
        )
        self.shutdown_timeout_s = shutdown_timeout_s
        self._tick_s = max(min(poll_timeout_s, stall_window_s / 10), 0.005)
        self._driver = EngineDriver(
            engine,
            name=self.engine_id,
            poll_timeout_s=poll_timeout_s,
            inbox_size=4 * g.max_batch_size + 64,
            outbox_size=4 * g.max_batch_size + 64,
            shutdown_timeout_s=shutdown_timeout_s,
            hold_results_above=g.max_batch_size if engine.queues_beyond_slots else None,
        )
        self._stats = EngineStats(
            node=node,
            card=self.engine_id,
            tier=plan.contract.contract,
            slots=g.max_batch_size,
            token_budget=g.max_num_tokens,
            kv_blocks_total=g.kv_blocks_total,
        )
        self._table = FlightTable(g.max_batch_size, g.kv_blocks_total, queue_slots=g.queue_slots)
        self._out = Outcomes(
            engine_id=self.engine_id, source=source, deliver=deliver, stats=self._stats
        )
        self._stall = StallWatch(stall_window_s, self.takeback_interval_s, time.monotonic())
        self._rate = DeliveryRate(TPS_HALF_LIFE_S)
        self._occupancy = Occupancy()
        self.failure: Optional[str] = None  # why the engine was given up on
        self._phase = "idle"                # idle -> running -> stopped
        self._backed_up = False             # the engine reports queued work and no free KV block
        self._busy_until = 0.0              # after a refusal, admission waits out the backoff
        self._draining = self._stopping = self._hung = False
        self._wake: Optional[asyncio.Event] = None
        self._finished: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    # ------------------------------------------------------------------ public
    @property
    def state(self) -> str:
        """idle | running | draining | stalled | wedged | stopped | failed."""
        if self.failure is not None:
            return "failed"
        if self._phase != "running":
            return self._phase
        return self._stall.state or ("draining" if self._draining else "running")

    def stats(self) -> EngineStats:
        return replace(
            self._stats,
            timestamp=time.time(),
            in_flight=self._table.in_flight(),
            kv_blocks_reserved=self._table.reserved,
            tokens_per_s=self._rate.tokens_per_s,
            output_tokens_per_s=self._rate.generated_per_s,
        )

    async def run(self) -> None:
        """Admit work until drained, stopped or the engine fails; the engine is shut down on the way
        out."""
        self._loop = asyncio.get_running_loop()
        self._wake, self._finished = asyncio.Event(), asyncio.Event()
        self._phase = "running"
        self._driver.start(self._loop, self._on_events)
        watchdog = asyncio.create_task(self._watch(), name=f"admission-watch-{self.engine_id}")
        try:
            while not (self.failure or self._stopping or (self._draining and not self._table)):
                if not self._may_admit():
                    await self._sleep(self._tick_s)
                    continue
                reqs = await self.source.take(
                    free_slots=self._table.free_slots(),
                    free_kv_blocks=self._table.free_kv_blocks(),
                    timeout_s=self._tick_s,
                )
                if reqs:
                    self._admit(reqs)
        finally:
            watchdog.cancel()
            # nothing we own is lost
            self._give_back(list(self._table.live.values()), "the runtime stopped")
            self._phase = "stopped"
            await self._shutdown_engine()
            self._finished.set()

    async def drain(self, timeout_s: float) -> bool:
        """Take nothing new; wait (bounded) for what is in flight. True when all of it finished here
        (False if the engine failed: its work went back to the source)."""
        self._draining = True
        self._kick()
        deadline = time.monotonic() + timeout_s
        while (
            self._table
            and time.monotonic() < deadline
            and self._finished
            and not self._finished.is_set()
        ):
            await asyncio.sleep(min(self._tick_s, max(deadline - time.monotonic(), 0)))
        return not self._table and self.failure is None

    async def stop(self) -> None:
        """Give every in-flight request back to the source, cancel it in the engine, shut the engine
        down."""
        self._stopping = True
        self._give_back(list(self._table.live.values()), "the runtime stopped")
        if self._finished is None:           # run() never started: shut the engine down here
            self._phase = "stopped"
            await asyncio.wait_for(asyncio.to_thread(self.engine.shutdown, self.shutdown_timeout_s),
                                   self.shutdown_timeout_s + 1.0)
            return
        self._kick()
        try:
            await asyncio.wait_for(self._finished.wait(), self.shutdown_timeout_s + 1.0)
        except asyncio.TimeoutError:
            log.warning(
                "card %s: runtime did not stop within %.1f s",
                self.engine_id,
                self.shutdown_timeout_s,
            )

    def cancel(self, key: RequestKey) -> bool:
        """The caller gave up on the request under `key`: if this runtime owns it, stop it in the
        engine (the slot and KV reservation stay until the engine lets go) and settle it as
        cancelled. False when it is not held here."""
        f = self._table.live.get(key)
        if f is None:
            return False
        in_engine = f.state != "waiting" and self.failure is None
        self._table.release(f, engine_holds=in_engine)
        if in_engine:
            self._driver.cancel(f.key)
        self._stats.requests_cancelled += 1
        self._out.settle(
            f.req, EngineResult(request_id=key, output_ids=[], finish_reason="cancelled")
        )
        if not self._table:
            self._rate.idle()
        self._occupancy.set(time.monotonic(), self._table.occupancy())
        self._kick()
        return True

    # ------------------------------------------------------------------ admission
    def _may_admit(self) -> bool:
        return (self.state == "running" and not self._backed_up
                and time.monotonic() >= self._busy_until and self._table.fits(1))

    def _admit(self, reqs: list[HostRequest]) -> None:
        now, batch, excess = time.monotonic(), [], []
        tpb = self.geometry.tokens_per_block
        for req in reqs:
            if req.abandoned:                 # its caller left while it was queued: never start it
                self._stats.requests_cancelled += 1
                self._out.settle(
                    req, EngineResult(request_id=req.key, output_ids=[], finish_reason="cancelled")
                )
                continue
            limit_s = req.options.deadline_s
            deadline = req.enqueued_at + limit_s if limit_s is not None else None
            if deadline is not None and now >= deadline:
                self._out.fail(req, f"deadline exceeded ({limit_s:g} s) before an engine took it")
                continue
            n = len(req.prompt)
            f = self._table.add(
                req,
                blocks=blocks_for(n, req.max_new_tokens, tpb),
                input_tokens=n,
                deadline=deadline,
            )
            if f is None:
                excess.append(req)
            else:
                batch.append(f)
        if excess:  # the source over-gave; admission's bound holds regardless
            log.error(
                "card %s: %d request(s) beyond free capacity; requeued", self.engine_id, len(excess)
            )
            self._out.requeue(excess, "admission capacity")
        if batch:
            self._rate.busy(now)
            self._occupancy.set(now, self._table.occupancy())
            self._send(batch)

    def _send(self, batch: list[Flight]) -> None:
        reqs = []
        for f in batch:
            r, o = f.req, f.req.options
            f.state = "sending"
            reqs.append(
                EngineRequest(
                    request_id=f.key,
                    prompt_ids=r.prompt,
                    max_new_tokens=r.max_new_tokens,
                    sampling=o.sampling,
                    guide=o.guide,
                    want_hidden=o.want_hidden,
                    priority=r.priority,
                    stream=o.stream,
                )
            )
        if not self._driver.submit(reqs):
            self._on_busy([f.key for f in batch])

    def _on_busy(self, keys: list[RequestKey]) -> None:
        self._stats.admission_refusals += 1
        for k in keys:
            if k not in self._table.live:
                self._table.returned(k)       # given back on its way in: the engine never held it
        batch = [self._table.live[k] for k in keys if k in self._table.live]
        if not batch:
            return
        tries = max(f.refusals for f in batch) + 1
        for f in batch:
            f.refusals, f.state = tries, "waiting"
        if tries > constants.SUBMIT_RETRY_LIMIT:
            self._give_back(batch, f"engine refused it {tries} times")
            return
        self._stats.retries += 1
        delay = min(
            constants.SUBMIT_BACKOFF_BASE_S * 2 ** (tries - 1), constants.SUBMIT_BACKOFF_MAX_S
        )
        self._busy_until = time.monotonic() + delay
        self._loop.call_later(delay, self._resend, batch)

    def _resend(self, batch: list[Flight]) -> None:
        live = [f for f in batch if self._table.owns(f) and f.state == "waiting"]
        if live and not self._stopping and self.failure is None:
            self._send(live)

    # ------------------------------------------------------------------ engine events (on the loop)
    def _on_events(self, events: list[DriverEvent]) -> None:
        for ev in events:
            kind = type(ev)
            if kind is Progressed:
                self._on_progress(ev.progress.results)
            elif kind is Partials:
                self._on_partials(ev.partials)
            elif kind is Submitted:
                for k in ev.keys:
                    f = self._table.live.get(k)
                    if f is not None:
                        f.state = "running"
                    else:                     # given back while its submit was on the way: stop it
                        self._driver.cancel(k)
            elif kind is Busy:
                self._on_busy(ev.keys)
            elif kind is Sampled:
                self._on_engine_stats(ev.stats)
            elif kind is Failed:
                self._on_failure(ev.message)
        self._kick()

    def _on_progress(self, results: list[EngineResult]) -> None:
        now = time.monotonic()
        ended = self._stall.progress(now)
        if ended is not None:
            log.info("card %s: tokens flow again; admission resumes", self.engine_id)
            if ended == "wedged":
                self._out.set_healthy(True)
        if not results:
            return
        occupancy = self._occupancy.take(now)     # up to now, with these results still in flight
        tokens = generated = 0
        for r in results:
            f = self._table.returned(r.request_id)
            if f is not None:  # (None: an orphan came back; its reservation is free again)
                done = self._out.delivered(f.req, r, f.input_tokens)
                tokens += done
                generated += len(r.output_ids) if done else 0
        if tokens:
            self._out.quietly(
                self.source.record_delivery,
                tokens,
                self._rate.delivered(tokens, now, generated),
                occupancy,
            )
        self._occupancy.set(now, self._table.occupancy())
        if not self._table:
            self._rate.idle()

    def _on_partials(self, partials: list) -> None:
        if self.partial is None:
            return
        for key, ids in partials:
            f = self._table.live.get(key)
            if f is not None:
                self._out.quietly(self.partial, f.req, ids)

    def _on_engine_stats(self, it: IterationStats) -> None:
        s = self._stats
        s.kv_blocks_used, s.kv_blocks_free, s.engine_queued = (
            it.kv_blocks_used,
            it.kv_blocks_free,
            it.queued,
        )
        s.tokens_last_step, s.engine_steps, s.prefix_hit_tokens = (
            it.tokens_last_step,
            it.steps,
            it.prefix_hit_tokens,
        )
        s.preemptions = it.preemptions
        backed_up = it.queued > 0 and it.kv_blocks_free == 0 and it.kv_blocks_used > 0
        if backed_up and not self._backed_up:
            # the engine cannot schedule what it holds: let it progress first
            s.progress_only_steps += 1
        self._backed_up = backed_up

    def _on_failure(self, message: str) -> None:
        if self.failure is not None:
            return
        log.error("card %s: %s; in-flight work goes back to its links", self.engine_id, message)
        self.failure = message
        self._out.set_healthy(False)
        self._table.forget_engine()
        self._give_back(list(self._table.live.values()), message)
        self._kick()

    # ------------------------------------------------------------------ watchdog: deadlines,
    # liveness, stalls
    async def _watch(self) -> None:
        clock, last = pause_clock(), time.monotonic()
        while True:
            await asyncio.sleep(self._tick_s)
            now = time.monotonic()
            # Time this process was stopped (SIGSTOP, Ctrl-Z) is not the engine's: its call and its
            # silence are judged on the time we were there to watch (forge/watchdogs/awake.py).
            self._stall.skip(clock.paused_since(last, now), now)
            last = now
            for f in self._table.expired(now):
                self._table.release(f, engine_holds=f.state == "running")
                if f.state == "running":
                    self._driver.cancel(f.key)
                self._out.fail(f.req, f"deadline exceeded ({f.req.options.deadline_s:g} s)")
            if not (self.failure or self._stopping):
                limit = max(self.stall_window_s, 20 * self._driver.poll_timeout_s)
                inside = self._driver.busy_in_engine_since
                if inside is not None:
                    limit += clock.paused_since(inside, now)
                why = self._driver.trouble(now, limit)
                if why is not None:
                    self._hung = self._driver.alive()  # stuck inside the engine: never wait for it
                    self._on_failure(why)
                self._check_stall(now)

    def _check_stall(self, now: float) -> None:
        youngest = self._table.youngest_running()
        action = self._stall.check(
            now, owed=bool(youngest or self._table.orphans), can_take_back=bool(youngest)
        )
        if action == "pause":
            log.warning("card %s: no token for %.1f s with %d in flight: progress-only step",
                        self.engine_id, self._stall.silent_for(now), self._table.in_flight())
            self._stats.stalls += 1
            self._stats.progress_only_steps += 1
        elif action == "take_back":
            self._table.release(youngest, engine_holds=True)
            self._driver.cancel(youngest.key)
            self._out.requeue([youngest.req], "taken back from a stalled engine")
        elif action == "wedged":
            log.error(
                "card %s: wedged (silent with all its work taken back); marked unhealthy",
                self.engine_id,
            )
            self._out.set_healthy(False)

    # ------------------------------------------------------------------ giving back
    def _give_back(self, flights: list[Flight], reason: str) -> None:
        """Requeue flights we own; an engine that is still alive keeps their reservation until it
        lets go."""
        mine = [f for f in flights if self._table.owns(f)]
        for f in mine:
            in_engine = f.state != "waiting" and self.failure is None
            self._table.release(f, engine_holds=in_engine)
            if in_engine and f.state == "running":
                self._driver.cancel(f.key)
        self._out.requeue([f.req for f in mine], reason)
        self._occupancy.set(time.monotonic(), self._table.occupancy())
        if not self._table:
            self._rate.idle()

    # ------------------------------------------------------------------ plumbing
    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _sleep(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _shutdown_engine(self) -> None:
        self._driver.stop()
        if self._hung:  # its thread is stuck inside the engine: waiting for it would hang us too
            log.error(
                "card %s: engine thread left behind inside a hung engine call", self.engine_id
            )
            return
        ok = await asyncio.to_thread(
            self._driver.join, self.shutdown_timeout_s + 2 * self._driver.poll_timeout_s
        )
        if not ok:
            log.error(
                "card %s: engine did not shut down within %.1f s",
                self.engine_id,
                self.shutdown_timeout_s,
            )
