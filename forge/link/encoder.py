"""Tokenization by the engine hosts: prompts go, in batches, to a host that has the tokenizer.

The broker measures every request in each engine's own tokens (geometry, prefix groups), and engines
that share a tokenizer (the same files, see forge/host/wire.tokenizer_identity) share one
tokenization. A node that has no usable copy of a tokenizer (a cluster job's driver; a local node
whose copy did not encode the probe texts exactly as the engine does) sends texts in batches to any
live host with that tokenizer."""
from __future__ import annotations

import asyncio
import itertools
from forge import constants
from forge.errors import ForgeError
from forge.link.coalesce import Coalescer

MAX_BATCH = 512
LINGER_S = 0.001
MAX_CALLS_IN_FLIGHT = 8
CALL_TIMEOUT_S = constants.STALL_WINDOW_S  # a tokenizing engine silent this long is tried no more


class EncodeFailed(ForgeError):
    """No engine with this tokenizer answered."""


class Encoder:
    def __init__(self, key: str, links: list):
        self.key, self.links = key, list(links)
        self._rr = itertools.count()
        self._calls = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)
        self._batches: Coalescer[str] = Coalescer(
            self._call, max_batch=MAX_BATCH, linger_s=LINGER_S
        )

    async def encode(self, text: str) -> tuple[int, ...]:
        return await self._batches.add(text)

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
        # whatever happened (a short answer, a cancel), every caller of this batch gets an answer
        finally:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(EncodeFailed(f"tokenizer {self.key}: {why}"))

    async def close(self) -> None:
        await self._batches.cancel()
