"""A provisioned node seen from `forge deploy`, with its engine and broker stats: the job's report
gets per-card data and plots as `forge run`'s does.

A background task polls the node's GET /v1/stats (bounded timeout, fixed interval); `engine_stats()`
and `broker_stats()` return the latest answer at once, as the sampler needs. The node's counters run
since it was provisioned; the report is about this job, so counters are taken relative to their
values when the job started (other jobs on the same node at the same time are counted too: the node
cannot tell them apart)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Optional

import httpx

from forge.node.remote import RemoteNode
from forge.stats import BrokerStats, EngineStats

POLL_INTERVAL_S = 0.25
POLL_TIMEOUT_S = 2.0
# Fields that only go up while the node lives: the job's share is the difference from the job's
# start.
ENGINE_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "requests_ok",
    "requests_failed",
    "requests_cancelled",
    "requests_requeued",
    "admission_refusals",
    "retries",
    "stalls",
    "progress_only_steps",
    "engine_steps",
    "prefix_hit_tokens",
)
BROKER_COUNTERS = (
    "dispatched",
    "affinity_hits",
    "affinity_spills",
    "prompt_tokens",
    "shared_prefix_tokens",
    "padded_tokens",
    "batch_tokens",
    "no_fit",
)


def _build(cls, data: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _since(now, base, counters: tuple[str, ...]):
    if base is None:
        return now
    return dataclasses.replace(
        now, **{k: max(0, getattr(now, k) - getattr(base, k)) for k in counters}
    )


class StatsRemoteNode(RemoteNode):
    def __init__(self, url: str, **kw):
        super().__init__(url, **kw)
        self._engines: list[EngineStats] = []
        self._broker: Optional[BrokerStats] = None
        self._base_engines: dict[str, EngineStats] = {}
        self._base_broker: Optional[BrokerStats] = None
        self._poller: Optional[asyncio.Task] = None
        self.stats_error: Optional[str] = None

    async def start(self) -> dict:
        info = await super().start()
        if await self._poll_once():
            self._base_engines = {s.card: s for s in self._engines}
            self._base_broker = self._broker
        self._poller = asyncio.create_task(self._poll())
        return info

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await super().close()

    async def _poll_once(self) -> bool:
        try:
            r = await self._client.get("/v1/stats", timeout=POLL_TIMEOUT_S)
            body = r.json() if r.status_code == 200 else None
            engines = [_build(EngineStats, e) for e in body["engines"]]
            broker = _build(BrokerStats, body["broker"])
        # the report says so; the job goes on
        except (httpx.HTTPError, ValueError, TypeError, KeyError) as e:
            self.stats_error = f"GET /v1/stats: {type(e).__name__}: {e}"
            return False
        self._engines, self._broker = engines, broker
        return True

    async def refresh_stats(self) -> None:
        """One poll now: the job's final figures include its last results."""
        await self._poll_once()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self._poll_once()

    def engine_stats(self) -> list[EngineStats]:
        return [_since(s, self._base_engines.get(s.card), ENGINE_COUNTERS) for s in self._engines]

    def broker_stats(self) -> Optional[BrokerStats]:
        return (
            None
            if self._broker is None
            else _since(self._broker, self._base_broker, BROKER_COUNTERS)
        )
