"""Tokenization by the engine hosts: prompts go, in batches, to a host that has the tokenizer.

The broker measures every request in each engine's own tokens (geometry, prefix groups), and engines that
share a tokenizer (the same files, see forge/host/wire.tokenizer_identity) share one tokenization. A node
that has no usable copy of a tokenizer (a cluster job's driver; a local node whose copy did not encode the
probe texts exactly as the engine does) sends texts in batches to any live host with that tokenizer."""
from __future__ import annotations

import asyncio
import itertools
from typing import Optional

from forge import constants
from forge.errors import ForgeError

MAX_BATCH = 512
LINGER_S = 0.001
MAX_CALLS_IN_FLIGHT = 8
CALL_TIMEOUT_S = constants.STALL_WINDOW_S      # a tokenizing engine silent this long is tried no more


class EncodeFailed(ForgeError):
    """No engine with this tokenizer answered."""


class Encoder:
    def __init__(self, key: str, links: list):
        self.key, self.links = key, list(links)
        self._rr = itertools.count()
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._calls = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)
        self._tasks: set[asyncio.Task] = set()

    async def encode(self, text: str) -> tuple[int, ...]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((text, fut))
        if len(self._pending) >= MAX_BATCH:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LINGER_S, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            task = asyncio.ensure_future(self._call(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _candidates(self) -> list:
        up = [lk for lk in self.links if lk.state == "up"]
        start = next(self._rr)
        return [up[(start + i) % len(up)] for i in range(len(up))] if up else []

    async def _call(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        texts = [t for t, _ in batch]
        why = "no engine with this tokenizer is up"
        try:
            async with self._calls:
                for link in self._candidates():
                    try:
                        ids = await link.transport.encode(texts, timeout_s=CALL_TIMEOUT_S)
                        answers = [tuple(int(i) for i in one) for one in ids]
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - try the next engine with the same tokenizer
                        why = f"{link.eid}: {type(e).__name__}"
                        continue
                    if len(answers) != len(batch):
                        why = f"{link.eid}: answered {len(answers)} of {len(batch)} texts"
                        continue
                    for (_, fut), one in zip(batch, answers):
                        if not fut.done():
                            fut.set_result(one)
                    return
        finally:    # whatever happened (a short answer, a cancel), every caller of this batch gets an answer
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(EncodeFailed(f"tokenizer {self.key}: {why}"))

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
