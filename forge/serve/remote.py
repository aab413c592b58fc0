"""A node provisioned elsewhere (`forge provision`), as `forge serve --remote` sees it.

One POST /v1/generate per generate call (no coalescing, unlike the bulk client in forge/functions/remote.py):
cancelling a call closes its connection, and the node's control endpoint cancels that request's engine work
when its client disconnects. Online priority and the remaining deadline travel with each request."""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import httpx

from forge.broker.types import QueueFull
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import GenerateParams
from forge.node.interface import Answer
from forge.node.remote import generation_of, generate_item
from forge.requests.stops import StopRule


class RemoteOnlineNode:
    tokenizers: dict = {}           # the node's tokenizer is not here: chat uses the plain transcript

    def __init__(self, url: str, *, token: Optional[str] = None, max_connections: int = 1024):
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers,
                                       limits=httpx.Limits(max_connections=max_connections),
                                       timeout=httpx.Timeout(None, connect=10.0))
        self.info: dict = {}
        self.name, self.started_at, self.closed = "?", 0.0, False
        self.abandoned = 0
        self._open = 0

    async def start(self) -> None:
        try:
            r = await self._http.get("/v1/node")
        except httpx.HTTPError as e:
            raise ForgeError(f"node at {self.url} is unreachable: {e}") from None
        if r.status_code != 200:
            raise ForgeError(f"node at {self.url} answered {r.status_code} to GET /v1/node"
                             + (" (wrong or missing token)" if r.status_code == 401 else f": {r.text[:200]}"))
        self.info = r.json()
        self.name, self.started_at = self.info.get("node", "?"), time.time()

    def describe(self) -> dict:
        return self.info

    def open_requests(self) -> int:
        return self._open

    async def drain(self, timeout_s: float) -> bool:
        self.closed = True
        return True

    async def stop(self) -> None:
        self.closed = True
        await self._http.aclose()

    async def submit(self, prompt: str | Sequence[int], params: GenerateParams, *, wait: bool = True) -> Answer:
        out = await self._post(generate_item(prompt, params))
        gen = generation_of(out)
        return Answer(gen, out.get("hidden"))

    async def complete(self, prompt: str | Sequence[int], params: GenerateParams, stop: StopRule):
        """A generation cut at its stop strings by the node, which has the tokenizer to count what remains."""
        item = generate_item(prompt, params)
        if stop.strings:
            item.update(stop=list(stop.strings), include_stop_str_in_output=stop.include)
        out = await self._post(item)
        gen = generation_of(out)
        return gen, out.get("stop_reason")

    async def _post(self, item: dict[str, Any]) -> dict:
        if self.closed:
            raise RequestRejected(f"forge serve for node {self.name} is draining")
        self._open += 1
        try:
            r = await self._http.post("/v1/generate", json={"requests": [item]})
        except httpx.TransportError as e:
            raise ForgeError(f"node {self.name} at {self.url}: {type(e).__name__}: {e}") from None
        except BaseException:
            self.abandoned += 1              # cancelled: the connection closes and the node cancels the work
            raise
        finally:
            self._open -= 1
        if r.status_code in (429, 503):
            raise QueueFull(f"node {self.name} answered {r.status_code}") if r.status_code == 429 else \
                NodeDown(f"node {self.name} is draining or down")
        if r.status_code != 200:
            raise ForgeError(f"node {self.name} answered {r.status_code}: {r.text[:200]}")
        out = r.json()["results"][0]
        if "error" in out:
            err = out["error"]
            raise (RequestRejected if err.get("type") == "RequestRejected" else ForgeError)(err.get("message", "?"))
        return out
