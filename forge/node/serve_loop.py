"""Serve a started node over HTTP until SIGINT/SIGTERM (or a stop event, or the server ending), then
drain it: what `forge provision` (the control endpoint) and `forge serve` (functions and the OpenAI
API) both do once they are up.

The drain is bounded (`drain_s`): the node stops taking work and finishes what it holds, the server
closes, the node stops. The exit code says whether in-flight work was cut short (1) or not (0)."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Callable, Optional

from forge.node.interface import Node
from forge.web.server import QuietServer

SERVER_CLOSE_WAIT_S = 10.0
WAKE_EVERY_S = 0.5


async def serve_until_stopped(
    node: Node,
    web: QuietServer,
    serving: asyncio.Task,
    *,
    label: str,
    drain_s: float,
    stop: Optional[asyncio.Event] = None,
    every_s: float = WAKE_EVERY_S,
    tick: Optional[Callable[[], None]] = None,
    after_stop: Optional[Callable[[], None]] = None,
) -> int:
    """Wait for a stop, calling `tick()` every `every_s` while serving; then drain the node (at most
    `drain_s`), close the server (`serving` is its task), stop the node and call `after_stop()`.
    `label` names what stops in the two lines printed to stderr ("node N", "serve on node N").
    Returns 0 when the drain was clean, else 1."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not the main thread, or no signals here
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set() and not serving.done():
            if tick is not None:
                tick()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
    finally:
        print(f"forge: {label} draining…", file=sys.stderr, flush=True)
        clean = await node.drain(drain_s)
        web.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, SERVER_CLOSE_WAIT_S)
        await node.stop()
        if after_stop is not None:
            after_stop()
        print(f"forge: {label} stopped ({'clean' if clean else 'in-flight work cut short'})",
              file=sys.stderr, flush=True)
    return 0 if clean else 1
