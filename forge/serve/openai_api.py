"""OpenAI-compatible plain generation: /v1/models[/{id}], /v1/completions, /v1/chat/completions
(streaming too).

What each request parameter does (supported, no effect, refused) is in openai_params.py and
docs/serve.md. Differences from OpenAI and vLLM, on purpose: the node's cards are one pool (`model`
must name one of its tiers); `stop` strings cut the returned text (the engine still generates up to
its own stop, and usage counts only the tokens the answer stands for); a guided request ignores
`stop`. Streaming: each choice's text as the engine makes it (Node.stream: stop strings applied as
it comes); a guided choice's text comes whole, once checked."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Optional

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from forge.errors import RequestRejected
from forge.functions.api import GenerateParams, Generation
from forge.node.interface import Node
from forge.requests.messages import Chat
from forge.node.endpoint import ClientGone
from forge.serve.limits import EndpointGate, deadline_s
from forge.serve.online import OnlineCall, answer, describe_failure, error_response
from forge.serve.openai_models import ChatRequest, CompletionRequest, _Common, bounded_to_node

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
# A guided output that reached max_tokens is still whole: the guide closed it (the JSON parses and
# matches its schema, the choice is one of the list) and the node checked it. "length" would tell a
# client the text was cut (the OpenAI client's parse() raises LengthFinishReasonError on it), so it
# is answered "stop", with this stop_reason saying why.
GUIDE_CLOSED = "guided_output_closed_at_max_tokens"


def finish_of(gen: Generation, matched: Optional[str], guided: bool) -> tuple[str, Optional[str]]:
    """(finish_reason, stop_reason) of one choice, as OpenAI clients read them."""
    if guided and gen.finish_reason == "length":
        return "stop", GUIDE_CLOSED
    return FINISH.get(gen.finish_reason, "stop"), matched
# OpenAI's and vLLM's; chat defaults to the tier's max_output_len
COMPLETION_DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param



def max_input_len(node: Node) -> int:
    """The most prompt tokens any card of the node takes."""
    return max((int(c["limits"]["max_input_len"]) for c in node.describe()["cards"]), default=1)


def tier_limits(node: Node) -> dict[str, int]:
    """tier -> the largest max_output_len among its cards."""
    tiers: dict[str, int] = {}
    for c in node.describe()["cards"]:
        tiers[c["tier"]] = max(tiers.get(c["tier"], 0), int(c["limits"]["max_output_len"]))
    return tiers


def guide_params(req: _Common) -> tuple[Optional[tuple[str, ...]], Optional[dict]]:
    """(choice, json_schema) from structured_outputs / guided_choice / guided_json / response_format."""
    found: list[tuple[str, Optional[tuple[str, ...]], Optional[dict]]] = []
    so = req.structured_outputs
    if so is not None and so.choice:
        found.append(("structured_outputs.choice", tuple(so.choice), None))
    if so is not None and so.json_schema is not None:
        found.append(("structured_outputs.json", None, so.json_schema))
    if so is not None and so.json_object:
        found.append(("structured_outputs.json_object", None, {"type": "object"}))
    if req.guided_choice:
        found.append(("guided_choice", tuple(req.guided_choice), None))
    if req.guided_json is not None:
        found.append(("guided_json", None, req.guided_json))
    rf = req.response_format or {}
    kind = rf.get("type", "text")
    if kind == "json_schema":
        spec = rf.get("json_schema") or {}
        if not isinstance(spec.get("schema"), dict):
            raise BadRequest("response_format.json_schema.schema must be a JSON Schema object",
                             "response_format.json_schema.schema")
        found.append(("response_format", None, spec["schema"]))
    elif kind == "json_object":
        found.append(("response_format", None, {"type": "object"}))
    elif kind != "text":
        raise BadRequest(f"response_format.type {kind!r} is not supported (text, json_object, "
                         "json_schema)",
                         "response_format.type")
    if len(found) > 1:
        raise BadRequest(f"give one guide, not {' and '.join(f[0] for f in found)}", found[1][0])
    return (found[0][1], found[0][2]) if found else (None, None)


def request_params(
    req: _Common,
    chat: bool,
    tier_max_output: int,
    choice: Optional[tuple[str, ...]],
    json_schema: Optional[dict],
) -> GenerateParams:
    """The GenerateParams of one (chat) completion request, its guide already read (guide_params): OpenAI's
    defaults (temperature and top_p 1; max_tokens the tier's for a chat, 16 for a completion), the stop strings
    for the node to apply - none for a guided request, whose text is always whole. Raises RequestRejected or
    ValueError for a value no engine can represent."""
    max_tokens = (getattr(req, "max_completion_tokens", None) or req.max_tokens or
                  (tier_max_output if chat else COMPLETION_DEFAULT_MAX_TOKENS))
    guided = choice is not None or json_schema is not None
    return GenerateParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        seed=req.seed,
        choice=choice,
        json_schema=json_schema,
        stop=() if guided else tuple(req.stops),
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
    )


def openai_router(
    node: Node, gates: dict[str, EndpointGate], *, default_deadline_s: float
) -> APIRouter:
    router = APIRouter(tags=["openai"])
    tiers = tier_limits(node)
    Completion = bounded_to_node(CompletionRequest, max_input_len(node))
    ChatBody = bounded_to_node(ChatRequest, max_input_len(node))

    def model_card(model: str) -> dict:
        return {
            "id": model,
            "object": "model",
            "created": int(node.started_at or 0),
            "owned_by": f"forge:{node.name}",
            "max_output_len": tiers[model],
        }

    @router.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card(m) for m in sorted(tiers)]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id not in tiers:
            return error_response(404, "model_not_found", f"The model {model_id!r} does not exist "
                                                          "here (models: "
                                  f"{', '.join(sorted(tiers))})", param="model")
        return model_card(model_id)

    async def completions(
        req: CompletionRequest, request: Request, x_forge_deadline: Optional[str] = Header(None)
    ):
        echo: list[str] = []
        if req.echo:
            try:
                echo = [p if isinstance(p, str) else decode_prompt(node, p) for p in req.prompts]
            except BadRequest as e:
                return error_response(400, "invalid_request_error", str(e), param=e.param)
        return await _generate(
            request,
            req,
            req.prompts,
            "text_completion",
            gates["completions"],
            x_forge_deadline,
            echo,
        )

    async def chat_completions(
        req: ChatRequest, request: Request, x_forge_deadline: Optional[str] = Header(None)
    ):
        try:  # the node renders it: the model's template, or the plain transcript where it has none
            prompt = Chat.of(
                [m.model_dump(include={"role", "content"}) for m in req.messages],
                transcript_fallback=True,
            )
        except RequestRejected as e:
            return error_response(400, "invalid_request_error", str(e), param="messages")
        return await _generate(
            request, req, [prompt], "chat.completion", gates["chat"], x_forge_deadline, []
        )

    # The bodies bounded to this node (a class made here: string annotations could not name it)
    completions.__annotations__["req"], chat_completions.__annotations__["req"] = (
        Completion,
        ChatBody,
    )
    router.post("/v1/completions")(completions)
    router.post("/v1/chat/completions")(chat_completions)

    async def _generate(
        request: Request,
        req: _Common,
        prompts: list,
        kind: str,
        gate: EndpointGate,
        header,
        echo: list[str],
    ):
        if req.model not in tiers:
            return error_response(404, "model_not_found", f"model {req.model!r} is not served here "
                                  f"(models: {', '.join(sorted(tiers))})", param="model")
        try:
            choice, schema = guide_params(req)
            limit_s = deadline_s(header, req.deadline_s, default_deadline_s)
        except BadRequest as e:
            return error_response(400, "invalid_request_error", str(e), param=e.param)
        except ValueError as e:      # a bad deadline
            return error_response(400, "invalid_request_error", str(e))
        chat = kind == "chat.completion"
        guided = choice is not None or schema is not None
        try:
            params = request_params(req, chat, tiers[req.model], choice, schema)
        # a value no engine can represent (top_k 2**31, ...)
        except (RequestRejected, ValueError) as e:
            return error_response(400, "invalid_request_error", str(e))
        n = req.n or 1
        rid = ("chatcmpl-" if chat else "cmpl-") + (req.request_id or uuid.uuid4().hex[:24])
        head = {"id": rid, "created": int(time.time()), "model": req.model}

        async def one(call, prompt, i: int):
            p = (
                params
                if req.seed is None or i == 0
                else replace(params, seed=choice_seed(req.seed, i))
            )
            answer = await call.submit(prompt, p)
            return answer.generation, answer.stop_reason

        async def work(call, slot):
            try:
                async with asyncio.TaskGroup() as group:  # one failing choice cancels the others
                    tasks = [
                        group.create_task(one(call, prompt, i))
                        for prompt in prompts
                        for i in range(n)
                    ]
            except BaseExceptionGroup as failed:  # answer for the first failure, as for one choice
                raise failed.exceptions[0] from None
            return [t.result() for t in tasks]

        if req.stream:
            return _stream(
                request, req, chat, head, gate, limit_s, prompts, params, n, echo, guided=guided
            )
        out = await answer(request, node, gate, limit_s, work)
        if not isinstance(out, list):
            return out
        choices = [
            choice_object(
                chat, j, gen, *finish_of(gen, matched, guided), echo[j // n] if echo else ""
            )
            for j, (gen, matched) in enumerate(out)
        ]
        return {**head, "object": kind, "choices": choices, "usage": usage_of(out, n)}

    def _stream(
        request,
        req: _Common,
        chat: bool,
        head: dict,
        gate: EndpointGate,
        limit_s: float,
        prompts: list,
        params: GenerateParams,
        n: int,
        echo: list[str],
        *,
        guided: bool,
    ):
        """SSE, each choice's text as the engine makes it (Node.stream). The gate is entered before the 200 goes out,
        so a full endpoint still answers 429; a client that leaves takes its generations back."""
        try:
            slot = gate.enter()
        except Exception as e:  # noqa: BLE001 - Overloaded
            return describe_failure(e, node, gate)
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def event(j: int, delta: Optional[str], finish: Optional[str] = None, role: bool = False,
                  matched: Optional[str] = None) -> str:
            if chat:
                d = (
                    {"role": "assistant", "content": ""}
                    if role
                    else {}
                    if delta is None
                    else {"content": delta}
                )
                ch = {"index": j, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                ch = {"index": j, "text": delta or "", "finish_reason": finish, "logprobs": None}
            if finish is not None:
                ch["stop_reason"] = matched
            return "data: " + json.dumps({**head, "object": obj, "choices": [ch]}) + "\n\n"

        async def events():
            call = OnlineCall(node, time.monotonic() + limit_s)
            # bounded by the choices' tokens: one piece per token at most
            merged: asyncio.Queue = asyncio.Queue()

            async def run(j: int, prompt, p: GenerateParams) -> None:
                try:
                    async for item in call.stream(prompt, p):
                        merged.put_nowait((j, item))
                except Exception as e:  # noqa: BLE001 - every failure becomes an event
                    merged.put_nowait((j, e))

            async def watch() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                merged.put_nowait((-1, ClientGone("client disconnected")))

            total = len(prompts) * n
            tasks = [
                asyncio.create_task(
                    run(
                        j,
                        prompts[j // n],
                        params
                        if req.seed is None or j % n == 0
                        else replace(params, seed=choice_seed(req.seed, j % n)),
                    )
                )
                for j in range(total)
            ]
            watcher = asyncio.create_task(watch())
            out: list = [None] * total
            try:
                for j in range(total):
                    if chat:
                        yield event(j, None, role=True)
                    elif echo:
                        yield event(j, echo[j // n])
                async with asyncio.timeout(limit_s):
                    while any(a is None for a in out):
                        j, item = await merged.get()
                        if isinstance(item, BaseException):
                            raise item
                        if isinstance(item, str):
                            yield event(j, item)
                            continue
                        out[j] = (item.generation, item.stop_reason)
                        finish, why = finish_of(item.generation, item.stop_reason, guided)
                        yield event(j, None, finish, matched=why)
                slot.ok = True
                if include_usage:
                    yield (
                        "data: "
                        + json.dumps(
                            {**head, "object": obj, "choices": [], "usage": usage_of(out, n)}
                        )
                        + "\n\n"
                    )
                yield "data: [DONE]\n\n"
            except ClientGone:
                return                      # nobody to tell; the finally takes the generations back
            except Exception as e:  # noqa: BLE001 - the 200 went out: the failure is the stream's last event
                yield "data: " + describe_failure(e, node, gate).body.decode() + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                for t in (*tasks, watcher):
                    t.cancel()  # a choice still running is cancelled in its engine (Node.stream)
                await asyncio.gather(*tasks, watcher, return_exceptions=True)
                slot.release()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            background=BackgroundTask(slot.release),
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router


def choice_object(
    chat: bool, index: int, gen: Generation, finish: str, matched: Optional[str], echo: str
) -> dict:
    """One entry of a (chat) completion's `choices`."""
    if chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": gen.text},
            "finish_reason": finish,
            "stop_reason": matched,
            "logprobs": None,
        }
    return {
        "index": index,
        "text": echo + gen.text,
        "finish_reason": finish,
        "stop_reason": matched,
        "logprobs": None,
    }


def usage_of(out: list[tuple[Generation, Optional[str]]], n: int) -> dict:
    """Prompt tokens once per prompt (not per choice, as vLLM counts them); completion tokens of every choice."""
    prompt = sum(gen.input_tokens for j, (gen, _) in enumerate(out) if j % n == 0)
    completion = sum(gen.output_tokens for gen, _ in out)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def choice_seed(seed: int, i: int) -> int:
    """Choice i's seed: the client's seed (checked as sent) plus i, wrapped within the engines' range [0, 2**63):
    seed 2**63 - 1 with n=2 must not fail on a seed the client never sent."""
    return (seed + i) % 2**63


def decode_prompt(node: Node, ids: list[int]) -> str:
    """A token-id prompt as text, for echo; BadRequest where the node's tokenizer is not in this process."""
    tok = node.tokenizer_for()
    if tok is None:
        raise BadRequest("echo of a token-id prompt needs the node's tokenizer, which is not in "
                         "this process "
                         "(forge serve --remote)", "echo")
    return tok.decode(ids)
