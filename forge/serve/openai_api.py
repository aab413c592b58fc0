"""OpenAI-compatible plain generation: /v1/models, /v1/completions, /v1/chat/completions (streaming included).

What differs from OpenAI, on purpose and said here: the node's cards are one pool (any of its models serves a
request; `model` must name one of them); n, logprobs, echo, best_of, penalties, logit_bias, tools are refused
with 400 rather than ignored; `stop` strings cut the returned text (the engine still generates up to its stop).
Extensions: `top_k`, `guided_choice`, `guided_json`, `deadline_s`; `response_format` json_schema / json_object
is honoured with guided decoding. Streaming: the engine hands forge the whole result, so the stream sends the
role at once and then the finished text in token-sized pieces (see docs/serve.md)."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Optional, Union

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.background import BackgroundTask

from forge.errors import RequestRejected
from forge.functions.api import GenerateParams
from forge.serve.chat import prompt_from_messages, stream_pieces
from forge.serve.limits import EndpointGate, deadline_s
from forge.serve.online import answer, describe_failure, error_response

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: Optional[int] = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    n: Literal[1] = 1
    stream: bool = False
    stream_options: Optional[dict] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    user: Optional[str] = None
    presence_penalty: Literal[0, 0.0] = 0
    frequency_penalty: Literal[0, 0.0] = 0
    logit_bias: Optional[dict] = Field(None, max_length=0)
    logprobs: Optional[Literal[False]] = None
    guided_choice: Optional[list[str]] = Field(None, min_length=1)
    guided_json: Optional[dict] = None
    response_format: Optional[dict] = None
    deadline_s: Optional[float] = Field(None, gt=0)

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs_off(cls, v: Any) -> Any:
        # Literal[False] alone lets 0 through (0 == False), and in completions `logprobs: 0` asks for logprobs.
        if v is not None and v is not False:
            raise ValueError(f"logprobs are not returned by forge: only false or null is accepted, got {v!r}")
        return v


class CompletionRequest(_Common):
    prompt: Union[str, list[int]]
    echo: Literal[False] = False
    best_of: Literal[1] = 1
    suffix: Optional[Literal[""]] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[str, list[dict]]
    name: Optional[str] = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, gt=0)


def models_of(node: Any) -> list[str]:
    return sorted({c["tier"] for c in node.describe()["cards"]})


def guide_params(req: _Common) -> tuple[Optional[tuple[str, ...]], Optional[dict]]:
    """(choice, json_schema) from guided_choice / guided_json / response_format; ValueError when contradictory."""
    choice = tuple(req.guided_choice) if req.guided_choice else None
    schema = req.guided_json
    rf = req.response_format or {}
    kind = rf.get("type", "text")
    if kind == "json_schema":
        spec = rf.get("json_schema") or {}
        if not isinstance(spec.get("schema"), dict):
            raise ValueError("response_format.json_schema.schema must be a JSON Schema object")
        schema = spec["schema"]
    elif kind == "json_object":
        schema = {"type": "object"}
    elif kind != "text":
        raise ValueError(f"response_format.type {kind!r} is not supported (text, json_object, json_schema)")
    if sum(x is not None for x in (choice, req.guided_json)) + (kind != "text") > 1:
        raise ValueError("give one of guided_choice, guided_json, response_format")
    return choice, schema


def cut_at_stop(text: str, stop) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


def openai_router(node: Any, gates: dict[str, EndpointGate], *, default_deadline_s: float) -> APIRouter:
    router = APIRouter(tags=["openai"])

    @router.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": m, "object": "model", "created": int(node.started_at or 0),
                                            "owned_by": f"forge:{node.name}"} for m in models_of(node)]}

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request,
                          x_forge_deadline: Optional[str] = Header(None)):
        return await _generate(request, req, req.prompt, "text_completion", gates["completions"], x_forge_deadline)

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request, x_forge_deadline: Optional[str] = Header(None)):
        try:
            prompt = prompt_from_messages(node, [m.model_dump(exclude_none=True) for m in req.messages])
        except ValueError as e:
            return error_response(400, "invalid_request_error", str(e))
        return await _generate(request, req, prompt, "chat.completion", gates["chat"], x_forge_deadline)

    async def _generate(request: Request, req: _Common, prompt, kind: str, gate: EndpointGate, header):
        if req.model not in models_of(node):
            return error_response(404, "model_not_found", f"model {req.model!r} is not served here "
                                  f"(models: {', '.join(models_of(node))})")
        try:
            choice, schema = guide_params(req)
            limit_s = deadline_s(header, req.deadline_s, default_deadline_s)
        except ValueError as e:      # a contradictory guide or a bad deadline
            return error_response(400, "invalid_request_error", str(e))
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or 16
        try:
            params = GenerateParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                    top_k=req.top_k, seed=req.seed, choice=choice, json_schema=schema)
        except RequestRejected as e:     # a value no engine can represent (top_k 2**31, temperature 1e-9, ...)
            return error_response(400, "invalid_request_error", str(e))
        rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": rid, "created": int(time.time()), "model": req.model}

        async def work(online, slot):
            gen, _ = await online.submit(prompt, params)
            text, stopped = cut_at_stop(gen.text, req.stop) if choice is None and schema is None else (gen.text, False)
            usage = {"prompt_tokens": gen.input_tokens, "completion_tokens": gen.output_tokens,
                     "total_tokens": gen.input_tokens + gen.output_tokens}
            return gen, text, ("stop" if stopped else FINISH.get(gen.finish_reason, "stop")), usage

        if not req.stream:
            out = await answer(request, node, gate, limit_s, work)
            if not isinstance(out, tuple):
                return out
            _, text, finish, usage = out
            choice0 = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                        "logprobs": None} if kind == "chat.completion" else
                       {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
            return {**head, "object": kind, "choices": [choice0], "usage": usage}
        return _stream(request, req, kind, head, gate, limit_s, work)

    def _stream(request, req: _Common, kind: str, head: dict, gate: EndpointGate, limit_s: float, work):
        """SSE. The gate is entered before the 200 goes out, so a full endpoint still answers 429."""
        try:
            slot = gate.enter()
        except Exception as e:  # noqa: BLE001 - Overloaded
            return describe_failure(e, node, gate)
        chat = kind == "chat.completion"
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        def event(delta: Optional[str], finish: Optional[str] = None, role: bool = False) -> str:
            if chat:
                d = ({"role": "assistant", "content": ""} if role else {} if delta is None else {"content": delta})
                ch = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                ch = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return "data: " + json.dumps({**head, "object": obj, "choices": [ch]}) + "\n\n"

        async def events():
            try:
                if chat:
                    yield event(None, role=True)
                out = await answer(request, node, _Borrowed(gate, slot), limit_s, work)
                if not isinstance(out, tuple):
                    yield "data: " + out.body.decode() + "\n\n"
                else:
                    gen, text, finish, usage = out
                    for piece in stream_pieces(node, gen, text):
                        yield event(piece)
                    yield event(None, finish)
                    if include_usage:
                        yield "data: " + json.dumps({**head, "object": obj, "choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                slot.release()

        return StreamingResponse(events(), media_type="text/event-stream", background=BackgroundTask(slot.release),
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return router


class _Borrowed:
    """A gate whose slot was already taken (by the stream, before its 200): answer() uses it as is."""

    def __init__(self, gate: EndpointGate, slot):
        self._gate, self._slot = gate, slot

    def enter(self):
        return self._slot

    def retry_after_s(self) -> int:
        return self._gate.retry_after_s()
