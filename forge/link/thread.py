"""The thread transport: the engine host on the node's own event loop, its engine on a driver thread
of the node's process (how every card ran before worker processes). Same protocol, no copy and no
IPC: a call is an await. Kept as the cheap path for tests and as the "before" of benchmarks
(--card-transport thread).

Engines are built one at a time here: they would share one process's state (torch's default dtype,
lazy imports), which is what raced when two cards loaded in threads of one process."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from forge import constants
from forge.config.plan import CardPlan
from forge.host.protocol import Hello, HostMethod
from forge.link.transport import LinkGone, Transport

_LOADING = threading.Lock()


class ThreadTransport(Transport):
    def __init__(
        self, plan: CardPlan, *, node: str, stall_window_s: float = constants.STALL_WINDOW_S
    ):
        self.plan, self.node, self.stall_window_s = plan, node, stall_window_s
        self.name = plan.engine_id
        self.host: Any = None

    def launch(self) -> None:
        """Nothing to start ahead: the engine is built in start()."""

    async def start(self) -> Hello:
        from forge.host.engine_host import EngineHost

        def build():
            with _LOADING:
                return EngineHost(self.plan, node=self.node, stall_window_s=self.stall_window_s)

        self.host = await asyncio.wait_for(
            asyncio.to_thread(build), constants.ENGINE_START_TIMEOUT_S
        )
        return await self.hello(timeout_s=constants.ENGINE_START_TIMEOUT_S)

    async def call(self, method: HostMethod, *args: Any, timeout_s: float) -> Any:
        # The host shares this loop: each of its calls is bounded by its own waits (collect by its
        # wait_s, drain by its timeout, stop by the engine's shutdown timeout), so no timer is added
        # here.
        return await getattr(self.host, method.value)(*args)

    async def reconnect(self, why: str, *, engine_failed: bool, incarnation: str) -> Hello:
        raise LinkGone(why)  # an engine in this process is not rebuilt: the card has failed

    async def close(self, timeout_s: float) -> None:
        if self.host is not None and not self.host.stopped:
            await self.stop(timeout_s=timeout_s)
