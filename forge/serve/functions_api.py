"""Each deployed function as `POST /v1/functions/NAME`: the body is one record (a JSON object), the answer is
what the function returns for it — the same function `forge run` maps over a dataset, on the same broker and
admission control, with online priority."""
from __future__ import annotations

import json
import traceback
from typing import Any, Optional, Sequence

from fastapi import APIRouter, Body, Header, Request
from fastapi.responses import JSONResponse

from forge.functions.api import FunctionSpec
from forge.node.interface import Node
from forge.serve.limits import DEADLINE_HEADER, EndpointGate, deadline_s
from forge.serve.online import answer, describe_failure, error_response

RECORD_EXAMPLE = {"id": 1, "text": "Alice was beginning to get very tired of sitting by her sister "
                                   "on the bank"}


def function_router(node: Node, specs: Sequence[FunctionSpec], gates: dict[str, EndpointGate], *,
                    default_deadline_s: float) -> APIRouter:
    router = APIRouter(tags=["functions"])
    for spec in specs:
        router.add_api_route(
            f"/v1/functions/{spec.name}",
            _endpoint(node, spec, gates[spec.name], default_deadline_s),
            methods=["POST"],
            name=spec.name,
            summary=f"Run {spec.name} on one record",
            description=(spec.fn.__doc__ or "").strip() or None,
            responses={
                429: {"description": "endpoint full; see Retry-After"},
                504: {"description": "deadline passed; the work was cancelled"},
            },
        )
    return router


class MissingField(KeyError):
    """A field the function read from the request's record and the record does not have."""


class Record(dict):
    """The request's body as the function gets it: a dict whose missing field raises MissingField (still a
    KeyError, so the function's own handling works), so a malformed body answers 400, not 500. A KeyError of the
    function's own data stays a 500. Top level only: nested objects are plain dicts."""

    def __missing__(self, key):
        raise MissingField(key)


def _where(exc: BaseException) -> str:
    """` (at FILE:LINE in FUNCTION)`: where the function read the field (the frame before Record's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    return f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""


def _endpoint(node: Node, spec: FunctionSpec, gate: EndpointGate, default_deadline_s: float):
    async def run_function(request: Request,
                           record: dict[str, Any] = Body(..., examples=[RECORD_EXAMPLE]),
                           x_forge_deadline: Optional[str] = Header(
                               None, description="seconds this request may take "
                                                 f"({DEADLINE_HEADER})")):
        try:
            limit_s = deadline_s(x_forge_deadline, None, default_deadline_s)
        except ValueError as e:
            return describe_failure(e, node, gate)

        async def work(call, slot):
            try:
                result = await spec.fn(Record(record), call.llm(spec))
            except MissingField as e:  # the body lacks what the function reads: the client's to fix
                return error_response(400, "invalid_request_error", "the record has no field "
                                                                    f"{e.args[0]!r}, which "
                                      f"{spec.name} reads{_where(e)}", param=str(e.args[0]))
            try:
                return JSONResponse(json.loads(json.dumps(result)))
            except (TypeError, ValueError) as e:
                return error_response(500, "function_error",
                                      f"{spec.name} returned a value that is not JSON: "
                                      f"{type(e).__name__}: {e}")

        return await answer(request, node, gate, limit_s, work)

    run_function.__name__ = f"function_{spec.name}"
    return run_function
