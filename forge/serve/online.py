"""One online request from admission to answer: the endpoint's gate (429), the deadline (504), the
client's disconnect (cancelled), and every error as one JSON object in the shape OpenAI clients read
(`{"error": {"message", "type", "code"}}`)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse

from forge.broker.types import QueueFull
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import FunctionSpec, GenerateParams
from forge.functions.llm import NodeLLM
from forge.node.endpoint import ClientGone, until_disconnected
from forge.node.interface import Answer, Node, Prompt
from forge.web import errors as web_errors
from forge.serve.limits import BadDeadline, EndpointGate, Overloaded, ONLINE_PRIORITY, Slot


class DeadlineExceeded(Exception):
    pass


class OnlineCall:
    """One online request's terms on the node: online priority, what is left of its deadline, and a full node
    refused at once (429) rather than waited for. The request itself is the node's (Node.submit)."""

    def __init__(self, node: Node, deadline_at: float):
        self.node, self.deadline_at = node, deadline_at

    def remaining_s(self) -> float:
        left = self.deadline_at - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("deadline exceeded")
        return left

    async def submit(self, prompt: Prompt, params: GenerateParams) -> Answer:
        params = replace(params, priority=ONLINE_PRIORITY, deadline_s=self.remaining_s())
        return await self.node.submit(prompt, params, wait=False)

    def stream(self, prompt: Prompt, params: GenerateParams) -> AsyncIterator[str | Answer]:
        params = replace(params, priority=ONLINE_PRIORITY, deadline_s=self.remaining_s())
        return self.node.stream(prompt, params, wait=False)

    def llm(self, spec: FunctionSpec) -> NodeLLM:
        """A function's llm handle for this request, on the same terms."""
        return NodeLLM(
            self.node, spec, priority=ONLINE_PRIORITY, deadline_at=self.deadline_at, wait=False
        )


def error_response(status: int, kind: str, message: str, headers: Optional[dict] = None, *,
                   param: Optional[str] = None) -> JSONResponse:
    return web_errors.error_response(status, kind, message, param=param, headers=headers)


def describe_failure(exc: BaseException, node: Node, gate: EndpointGate) -> JSONResponse:
    """The HTTP answer for whatever stopped a request."""
    if isinstance(exc, Overloaded):
        return error_response(429, "overloaded", str(exc), {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, QueueFull):
        return error_response(429, "overloaded", f"the node's queue is full: {exc}",
                              {"Retry-After": str(gate.retry_after_s())})
    if isinstance(exc, (DeadlineExceeded, asyncio.TimeoutError)):
        return error_response(504, "deadline_exceeded", "the request's deadline passed before its "
                                                        "answer was ready; "
                              "its work was cancelled")
    if isinstance(exc, ClientGone):
        return error_response(499, "client_closed", "client disconnected; its work was cancelled")
    if isinstance(exc, BadDeadline):
        return error_response(400, "invalid_request_error", str(exc))
    if isinstance(exc, NodeDown) or (isinstance(exc, RequestRejected) and node.closed):
        return error_response(503, "unavailable", str(exc))
    if isinstance(exc, RequestRejected):
        return error_response(
            400, "invalid_request_error", str(exc), param=getattr(exc, "param", None)
        )
    if isinstance(exc, ForgeError):  # the first line: engines may append their internal state
        return error_response(
            500, "engine_error", (str(exc).splitlines() or [type(exc).__name__])[0]
        )
    from forge.functions.runner import error_row

    # what failed first, then where: "KeyError: 'text' (at f.py:18 in f)"
    row = error_row(0, exc)["error"]
    return error_response(500, "function_error", f"{row['type']}: {row['message']}")


async def answer(request: Request, node: Node, gate: EndpointGate, deadline_s: float,
                 work: Callable[[OnlineCall, Slot], Awaitable[Any]]) -> Any:
    """Run `work(call, slot)` inside the endpoint's gate, bounded by the deadline and cancelled if the
    client leaves. Returns work's value, or the JSONResponse describing why there is none."""
    try:
        slot = gate.enter()
    except Overloaded as e:
        return describe_failure(e, node, gate)
    try:
        call = OnlineCall(node, time.monotonic() + deadline_s)
        value = await until_disconnected(request, asyncio.wait_for(work(call, slot), deadline_s))
        slot.ok = True
        return value
    except Exception as e:  # noqa: BLE001 - every failure becomes an answer
        return describe_failure(e, node, gate)
    finally:
        slot.release()
