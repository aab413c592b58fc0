"""The worker link's channel: calls and answers as pickle frames on a Unix socket pair
(forge/host/channel.py)."""
from __future__ import annotations

import asyncio
import socket

import pytest

from forge.errors import ForgeError
from forge.host.channel import CallChannel, RemoteError, open_socket, serve_calls


async def pair(dispatch):
    mine, theirs = socket.socketpair()
    r1, w1 = await open_socket(mine)
    r2, w2 = await open_socket(theirs)
    eofs: list[str] = []
    server = asyncio.ensure_future(serve_calls(r2, w2, dispatch))
    return CallChannel(r1, w1, on_eof=eofs.append), server, w2, eofs


def test_calls_answers_errors_and_end_of_file():
    async def dispatch(method, args):
        if method == "echo":
            return args
        if method == "slow":
            await asyncio.sleep(args[0])
            return "late"
        if method == "forge":
            raise ForgeError("card cpu0: no such thing")
        raise KeyError(method)

    async def main():
        ch, server, w2, eofs = await pair(dispatch)
        assert await ch.call("echo", 1, (2, 3), timeout_s=5) == (1, (2, 3))
        slow = asyncio.ensure_future(ch.call("slow", 0.2, timeout_s=5))
        assert await ch.call("echo", "first", timeout_s=5) == ("first",)     # answers in any order
        assert await slow == "late"
        with pytest.raises(ForgeError, match="card cpu0: no such thing"):
            await ch.call("forge", timeout_s=5)
        with pytest.raises(RemoteError, match="KeyError"):
            await ch.call("other", timeout_s=5)
        with pytest.raises(asyncio.TimeoutError):
            await ch.call("slow", 5.0, timeout_s=0.1)
        waiting = asyncio.ensure_future(ch.call("slow", 5.0, timeout_s=30))
        await asyncio.sleep(0.05)
        server.cancel()
        w2.close()                                     # the worker's end goes away
        with pytest.raises(ConnectionError):
            await waiting
        assert eofs and ch.closed
        with pytest.raises(ConnectionError):
            await ch.call("echo", timeout_s=5)
        await ch.close()

    asyncio.run(main())


def test_a_cancelled_call_stays_cancelled_when_its_answer_arrives_at_the_same_moment():
    """Python 3.11's asyncio.wait_for returns the answer instead (the cancellation is lost): a link
    being closed then kept polling, and `forge run` never exited."""
    async def dispatch(method, args):
        await asyncio.sleep(60)

    async def main():
        ch, server, w2, _ = await pair(dispatch)
        task = asyncio.ensure_future(ch.call("collect", timeout_s=30))
        await asyncio.sleep(0.05)
        ((_, fut),) = ch._calls.items()
        fut.set_result("an answer")  # what the read loop does when the answer comes
        task.cancel()                # ... and the link closes in the same turn
        with pytest.raises(asyncio.CancelledError):
            await task
        server.cancel()
        await ch.close()

    asyncio.run(main())
