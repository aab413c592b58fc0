"""Giving up on engines that are out, for a node whose engines are reached by links (linked.py).

An engine is out when it is gone for good (its link gave it up), when it stays lost (a cluster's
engine, not back within `down_grace_s`) or stays unhealthy (wedged) for `down_grace_s`. A local
card's worker being started again does not count: its restarts are bounded by themselves. Requests
that fit only engines that are out fail with NodeDown; when every engine is out the node is down:
everything waiting fails with NodeDown, a job stops without error rows, and the same command resumes
once the node is healthy."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from forge.broker import Broker, BrokerRequest
from forge.errors import NodeDown
from forge.link.link import EngineLink

log = logging.getLogger("forge.node")


class EnginesOut:
    """A node's watch over its engines. It reads the node's links and broker and acts only through
    what it is given: fail(request, message, error class) fails one request, node_down(details) puts
    the whole node down, running() says whether the node still runs (not stopped, not down)."""

    def __init__(
        self,
        links: dict[str, EngineLink],
        broker: Broker,
        *,
        label: str,
        down_grace_s: float,
        sweep_interval_s: float,
        restarting_counts: bool,
        fail: Callable[[BrokerRequest, str, type], None],
        node_down: Callable[[str], None],
        running: Callable[[], bool],
    ):
        self.links, self.broker, self.label = links, broker, label
        self.down_grace_s, self.sweep_interval_s = down_grace_s, sweep_interval_s
        # a link being brought back counts toward down_grace_s
        self.restarting_counts = restarting_counts
        self._fail, self._node_down, self._running = fail, node_down, running

    def out_for(self, lk: EngineLink, now: float) -> float:
        """How long this engine has been unusable (0 when it is usable, or being brought back within
        bounds)."""
        if lk.state == "gone":
            return float("inf")
        if lk.state == "down":
            return now - lk.down_since if self.restarting_counts else 0.0
        return now - lk.unhealthy_since if lk.unhealthy_since is not None else 0.0

    def why_out(self, lk: EngineLink) -> str:
        if lk.failure:
            return lk.failure
        if lk.state == "down":
            return f"{lk.lost_reason}; gone for {self.down_grace_s:g} s"
        return lk.engine_state if lk.engine_state != "running" else "unhealthy"

    async def sweep(self) -> None:
        while self._running():
            await asyncio.sleep(self.sweep_interval_s)
            now = time.monotonic()
            out = {
                eid for eid, lk in self.links.items() if self.out_for(lk, now) >= self.down_grace_s
            }
            if out and len(out) == len(self.links):
                self._node_down(
                    "; ".join(f"{eid}: {self.why_out(self.links[eid])}" for eid in sorted(out))
                )
                return
            if out and self.broker.pending():
                self._fail_unplaceable(out)

    def _fail_unplaceable(self, out: set[str]) -> None:
        core = self.broker.core
        pending = core.drain()
        kept = 0
        for req in pending:
            fits = core.fitting_engines(req)
            if any(e not in out for e in fits):
                core.add(req)
                kept += 1
            else:
                self._fail(req, f"{self.label}: every engine this request fits ({', '.join(fits)}) "
                           f"has been out for {self.down_grace_s:g} s", NodeDown)
        self.broker.notify()
        if kept < len(pending):
            log.error(
                "%s: %d request(s) failed: engines %s out for %g s",
                self.label,
                len(pending) - kept,
                ", ".join(sorted(out)),
                self.down_grace_s,
            )
