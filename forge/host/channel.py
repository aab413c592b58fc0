"""Calls over one connected Unix stream socket between a node and a worker process: pickle frames.

A frame is a 4-byte big-endian length and a pickle (protocol 5). The node sends (call id, method,
args); the worker answers (call id, ok, value), in any order, so a long poll (collect) and a submit
share one socket. Both ends run on asyncio streams: a write never blocks the loop (a worker that
stops reading costs the node buffered bytes bounded by the link's credit, and the call's timeout),
and end of file is seen at once. Why this and not multiprocessing's Pipe: docs/benchmarks.md
("Control plane", the card transport) has the measurement."""
from __future__ import annotations

import asyncio
import itertools
import pickle
import struct
import time
from typing import Any, Awaitable, Callable, Optional

from forge.errors import ForgeError
from forge.watchdogs.awake import pause_clock

HEADER = struct.Struct("!I")


class RemoteError(Exception):
    """The host raised something that is not a ForgeError; its type and message, in one line."""


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(n))


async def open_socket(sock) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(sock=sock, limit=1 << 20)


class CallChannel:
    """The node's end: call(method, *args) -> the worker's answer. EOF fails every call still
    waiting."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_eof: Callable[[str], None],
    ):
        self._reader, self._writer = reader, writer
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._on_eof = on_eof
        self.closed: Optional[str] = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop(), name="link-channel")

    async def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        if self.closed is not None:
            raise ConnectionError(self.closed)
        cid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._calls[cid] = fut
        # A timer, not asyncio.wait_for: on Python 3.11 wait_for swallows a cancellation that
        # arrives as the answer does, and a link being closed would then keep polling forever.
        timer = _CallTimer(loop, fut, method, timeout_s)
        try:
            self._writer.write(frame((cid, method, args)))
            return await fut
        finally:
            timer.cancel()
            self._calls.pop(cid, None)

    async def _read_loop(self) -> None:
        why = "the worker closed its end"
        try:
            while True:
                cid, ok, value = await read_frame(self._reader)
                fut = self._calls.pop(cid, None)
                if fut is None or fut.done():
                    continue                       # its caller timed out and left
                if ok:
                    fut.set_result(value)
                else:
                    kind, message = value
                    fut.set_exception(ForgeError(message) if kind == "ForgeError"
                                      else RemoteError(f"{kind}: {message}"))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            if not isinstance(e, asyncio.IncompleteReadError):
                why = f"{type(e).__name__}: {e}"
        except asyncio.CancelledError:
            why = "the channel was closed"
            raise
        finally:
            self.closed = why
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(why))
            self._calls.clear()
            self._on_eof(why)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._writer.close()


class _CallTimer:
    """Fails a call unanswered for `timeout_s` of this process's running time: a node stopped
    (SIGSTOP) longer than that and woken finds its workers' answers waiting, not late
    (forge/watchdogs/awake.py)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future, method: str, timeout_s: float
    ):
        self._loop, self._fut, self._method, self._timeout_s = loop, fut, method, timeout_s
        self._clock, self._since = pause_clock(loop), time.monotonic()
        self._handle = loop.call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        if self._fut.done():
            return
        left = self._timeout_s - self._clock.awake_since(self._since)
        if left > 0:                    # part of the wait passed while this process was stopped
            self._handle = self._loop.call_later(left, self._expire)
            return
        self._fut.set_exception(asyncio.TimeoutError(f"no answer to {self._method} within "
                                                     f"{self._timeout_s:g} s"))

    def cancel(self) -> None:
        self._handle.cancel()


async def serve_calls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      dispatch: Callable[[str, tuple], Awaitable[Any]]) -> str:
    """The worker's end: answer every call with dispatch(method, args) until the node's end closes;
    returns why."""
    tasks: set[asyncio.Task] = set()

    async def answer(cid: int, method: str, args: tuple) -> None:
        try:
            reply = (cid, True, await dispatch(method, args))
        except asyncio.CancelledError:
            raise
        except ForgeError as e:
            reply = (cid, False, ("ForgeError", str(e)))
        except Exception as e:  # noqa: BLE001 - the node gets every failure as an answer
            reply = (cid, False, (type(e).__name__, str(e)))
        try:
            data = frame(reply)
        except Exception as e:  # noqa: BLE001 - an answer that cannot be pickled is still answered
            data = frame((cid, False, (type(e).__name__, f"the answer to {method} cannot be sent: "
                                                         f"{e}")))
        writer.write(data)

    try:
        while True:
            cid, method, args = await read_frame(reader)
            task = asyncio.get_running_loop().create_task(answer(cid, method, args))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
        return (
            "the node closed its end"
            if isinstance(e, asyncio.IncompleteReadError)
            else f"{type(e).__name__}: {e}"
        )
    finally:
        for t in tasks:
            t.cancel()
