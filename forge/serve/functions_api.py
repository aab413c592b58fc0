"""Each deployed function as `POST /v1/functions/NAME`: the body is one record (a JSON object), the answer is
what the function returns for it — the same function `forge run` maps over a dataset, on the same broker and
admission control, with online priority."""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from fastapi import APIRouter, Body, Header, Request
from fastapi.responses import JSONResponse

from forge.functions.api import FunctionSpec
from forge.node.interface import Node
from forge.serve.limits import DEADLINE_HEADER, EndpointGate, deadline_s
from forge.serve.online import answer, describe_failure, error_response

RECORD_EXAMPLE = {"id": 1, "text": "Alice was beginning to get very tired of sitting by her sister on the bank"}


def function_router(node: Node, specs: Sequence[FunctionSpec], gates: dict[str, EndpointGate], *,
                    default_deadline_s: float) -> APIRouter:
    router = APIRouter(tags=["functions"])
    for spec in specs:
        router.add_api_route(f"/v1/functions/{spec.name}", _endpoint(node, spec, gates[spec.name], default_deadline_s),
                             methods=["POST"], name=spec.name,
                             summary=f"Run {spec.name} on one record",
                             description=(spec.fn.__doc__ or "").strip() or None,
                             responses={429: {"description": "endpoint full; see Retry-After"},
                                        504: {"description": "deadline passed; the work was cancelled"}})
    return router


def _endpoint(node: Node, spec: FunctionSpec, gate: EndpointGate, default_deadline_s: float):
    async def run_function(request: Request,
                           record: dict[str, Any] = Body(..., examples=[RECORD_EXAMPLE]),
                           x_forge_deadline: Optional[str] = Header(
                               None, description=f"seconds this request may take ({DEADLINE_HEADER})")):
        try:
            limit_s = deadline_s(x_forge_deadline, None, default_deadline_s)
        except ValueError as e:
            return describe_failure(e, node, gate)

        async def work(call, slot):
            result = await spec.fn(record, call.llm(spec))
            try:
                return JSONResponse(json.loads(json.dumps(result)))
            except (TypeError, ValueError) as e:
                return error_response(500, "function_error",
                                      f"{spec.name} returned a value that is not JSON: {type(e).__name__}: {e}")

        return await answer(request, node, gate, limit_s, work)

    run_function.__name__ = f"function_{spec.name}"
    return run_function
