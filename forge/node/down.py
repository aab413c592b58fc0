"""Giving up on engines that are out, for a node whose engines are reached by links (linked.py).

An engine is out when it is gone for good (its link gave it up), when it stays lost (a cluster's engine, not
back within `down_grace_s`) or stays unhealthy (wedged) for `down_grace_s`. A local card's worker being started
again does not count: its restarts are bounded by themselves. Requests that fit only engines that are out fail
with NodeDown; when every engine is out the node is down: everything waiting fails with NodeDown, a job stops
without error rows, and the same command resumes once the node is healthy."""
from __future__ import annotations

import asyncio
import logging
import time

from forge.errors import NodeDown
from forge.link.link import EngineLink

log = logging.getLogger("forge.node")


class EnginesOut:
    """Mixed into LinkedNode: its links, broker, futures, label and grace are read from there."""

    restarting_counts = True        # a link being brought back counts toward down_grace_s (no bound of its own)

    def _out_for(self, lk: EngineLink, now: float) -> float:
        """How long this engine has been unusable (0 when it is usable, or being brought back within bounds)."""
        if lk.state == "gone":
            return float("inf")
        if lk.state == "down":
            return now - lk.down_since if self.restarting_counts else 0.0
        return now - lk.unhealthy_since if lk.unhealthy_since is not None else 0.0

    def _why_out(self, lk: EngineLink) -> str:
        if lk.failure:
            return lk.failure
        if lk.state == "down":
            return f"{lk.lost_reason}; gone for {self.down_grace_s:g} s"
        return lk.engine_state if lk.engine_state != "running" else "unhealthy"

    async def _sweep(self) -> None:
        while not self.closed and not self.down:
            await asyncio.sleep(self.sweep_interval_s)
            now = time.monotonic()
            out = {eid for eid, lk in self.links.items() if self._out_for(lk, now) >= self.down_grace_s}
            if out and len(out) == len(self.links):
                self._node_down("; ".join(f"{eid}: {self._why_out(self.links[eid])}" for eid in sorted(out)))
                return
            if out and self.broker.pending():
                self._fail_unplaceable(out)

    def _node_down(self, details: str) -> None:
        self.down = f"{self.label}: no engine can work ({details})"
        log.error(self.down)
        for fut in list(self._futures.values()):
            if not fut.done():
                fut.set_exception(NodeDown(self.down))

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
            log.error("%s: %d request(s) failed: engines %s out for %g s", self.label, len(pending) - kept,
                      ", ".join(sorted(out)), self.down_grace_s)
