"""One online request from admission to answer: the endpoint's gate (429), the deadline (504), the client's
disconnect (cancelled), and every error as one JSON object in the shape OpenAI clients read
(`{"error": {"message", "type", "code"}}`)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Optional, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse

from forge.broker.types import QueueFull
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import GenerateParams, Generation
from forge.node.endpoint import ClientGone, until_disconnected
from forge.runtime import http_errors
from forge.requests.stops import StopRule, apply_stop, tokenizer_of
from forge.serve.limits import BadDeadline, EndpointGate, Overloaded, ONLINE_PRIORITY, Slot


class DeadlineExceeded(Exception):
    pass


class OnlineNode:
    """The node as one online request sees it: its generations carry online priority and what is left of the
    request's deadline, and a full broker is refused (429) rather than waited for."""

    def __init__(self, node: Any, deadline_at: float):
        self.node, self.deadline_at = node, deadline_at

    def remaining_s(self) -> float:
        left = self.deadline_at - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("deadline exceeded")
        return left

    async def submit(self, prompt: str | Sequence[int], params: GenerateParams):
        params = replace(params, priority=ONLINE_PRIORITY, deadline_s=self.remaining_s())
        return await self.node.submit(prompt, params, wait=False)

    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation:
        return (await self.submit(prompt, params)).generation

    async def complete(self, prompt: str | Sequence[int], params: GenerateParams,
                       stop: StopRule) -> tuple[Generation, Optional[str]]:
        """A generation cut at its stop strings, and the string matched. A remote node cuts it there (its
        tokenizer counts the tokens); a node in this process, here."""
        if hasattr(self.node, "complete"):
            params = replace(params, priority=ONLINE_PRIORITY, deadline_s=self.remaining_s())
            return await self.node.complete(prompt, params, stop)
        gen, _ = await self.submit(prompt, params)
        return apply_stop(gen, stop, tokenizer_of(self.node, gen.card))

    async def embed(self, prompt: str | Sequence[int]) -> list[float]:
        gen, hidden = await self.submit(prompt, GenerateParams(max_tokens=1, embed=True))
        if hidden is None:
            raise ForgeError(f"card {gen.card}: its backend returns no hidden state")
        return list(hidden)


def error_response(status: int, kind: str, message: str, headers: Optional[dict] = None, *,
                   param: Optional[str] = None) -> JSONResponse:
    return http_errors.error_response(status, kind, message, param=param, headers=headers)


def describe_failure(exc: BaseException, node: Any, gate: EndpointGate) -> JSONResponse:
    """The HTTP answer for whatever stopped a request."""
    if isinstance(exc, Overloaded):
        return error_response(429, "overloaded", str(exc), {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, QueueFull):
        return error_response(429, "overloaded", f"the node's queue is full: {exc}",
                              {"Retry-After": str(gate.retry_after_s())})
    if isinstance(exc, (DeadlineExceeded, asyncio.TimeoutError)):
        return error_response(504, "deadline_exceeded", "the request's deadline passed before its answer was ready; "
                              "its work was cancelled")
    if isinstance(exc, ClientGone):
        return error_response(499, "client_closed", "client disconnected; its work was cancelled")
    if isinstance(exc, BadDeadline):
        return error_response(400, "invalid_request_error", str(exc))
    if isinstance(exc, NodeDown) or (isinstance(exc, RequestRejected) and getattr(node, "closed", False)):
        return error_response(503, "unavailable", str(exc))
    if isinstance(exc, RequestRejected):
        return error_response(400, "invalid_request_error", str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, ForgeError):       # the first line: engines may append their internal state
        return error_response(500, "engine_error", (str(exc).splitlines() or [type(exc).__name__])[0])
    from forge.functions.runner import error_row

    row = error_row(0, exc)["error"]          # what failed first, then where: "KeyError: 'text' (at f.py:18 in f)"
    return error_response(500, "function_error", f"{row['type']}: {row['message']}")


async def answer(request: Request, node: Any, gate: EndpointGate, deadline_s: float,
                 work: Callable[[OnlineNode, Slot], Awaitable[Any]]) -> Any:
    """Run `work(online_node, slot)` inside the endpoint's gate, bounded by the deadline and cancelled if the
    client leaves. Returns work's value, or the JSONResponse describing why there is none."""
    try:
        slot = gate.enter()
    except Overloaded as e:
        return describe_failure(e, node, gate)
    try:
        online = OnlineNode(node, time.monotonic() + deadline_s)
        value = await until_disconnected(request, asyncio.wait_for(work(online, slot), deadline_s))
        slot.ok = True
        return value
    except Exception as e:  # noqa: BLE001 - every failure becomes an answer
        return describe_failure(e, node, gate)
    finally:
        slot.release()
