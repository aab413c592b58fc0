"""A provisioned node seen from `forge deploy` (the Node interface over HTTP): calls coalesced into batched POSTs.

One HTTP round trip per request would cap a job near a thousand requests/s; calls that arrive
within `linger_s` (or until `max_batch`) travel together, with a bounded number of POSTs in flight."""
from __future__ import annotations

import asyncio
from typing import Optional, Sequence

import httpx

from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import GenerateParams, Generation
from forge.node.interface import Answer, Node

CONNECT_RETRIES = 3


class RemoteNode(Node):
    def __init__(self, url: str, *, token: Optional[str] = None, max_batch: int = 256, linger_s: float = 0.002,
                 max_posts_in_flight: int = 8, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers,
                                         timeout=httpx.Timeout(timeout_s, connect=10.0))
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._posts = asyncio.Semaphore(max_posts_in_flight)
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._tasks: set[asyncio.Task] = set()
        self.name = "?"
        self.info: dict = {}

    async def start(self) -> dict:
        try:
            r = await self._client.get("/v1/node")
        except httpx.HTTPError as e:
            raise ForgeError(f"node at {self.url} is unreachable: {e}") from None
        if r.status_code == 401:
            raise ForgeError(f"node at {self.url} refused the token (set the node's token variable)")
        if r.status_code != 200:
            raise ForgeError(f"node at {self.url} answered {r.status_code}: {r.text[:200]}")
        self.info = r.json()
        self.name = self.info.get("node", "?")
        return self.info

    async def close(self) -> None:
        if self._timer:
            self._timer.cancel()
        self._flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def stop(self) -> None:
        await self.close()

    async def submit(self, prompt: str | Sequence[int], params: GenerateParams, *, wait: bool = True) -> Answer:
        out = await self._call(prompt, params)
        gen = Generation(text=out["text"], output_tokens=out["output_tokens"], input_tokens=out["input_tokens"],
                         finish_reason=out["finish_reason"], card=out.get("card", ""))
        return Answer(gen, out.get("hidden"))

    async def _call(self, prompt, params: GenerateParams) -> dict:
        item = {"prompt": prompt if isinstance(prompt, str) else list(prompt), "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                "seed": params.seed, "embed": params.embed, "priority": params.priority}
        if params.choice is not None:
            item["choice"] = list(params.choice)
        if params.json_schema is not None:
            item["json_schema"] = params.json_schema
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if len(self._pending) >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self._flush)
        out = await fut
        if "error" in out:
            err = out["error"]
            cls = {"RequestRejected": RequestRejected, "NodeDown": NodeDown}.get(err.get("type"), ForgeError)
            raise cls(err.get("message", "node error"))
        return out

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch:]
            task = asyncio.ensure_future(self._post(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _post(self, batch: list[tuple[dict, asyncio.Future]]) -> None:
        async with self._posts:
            err: Optional[Exception] = None
            for attempt in range(CONNECT_RETRIES):
                try:
                    r = await self._client.post("/v1/generate", json={"requests": [i for i, _ in batch]})
                    if r.status_code == 200:
                        for (_, fut), res in zip(batch, r.json()["results"]):
                            if not fut.done():
                                fut.set_result(res)
                        return
                    cls = NodeDown if r.status_code == 503 else ForgeError
                    err = cls(f"node {self.name} answered {r.status_code}: {r.text[:200]}")
                    if r.status_code not in (429, 503):
                        break
                except httpx.TransportError as e:
                    err = NodeDown(f"node {self.name} at {self.url} is unreachable: {type(e).__name__}: {e}")
                await asyncio.sleep(0.2 * 2**attempt)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err or ForgeError("node request failed"))
