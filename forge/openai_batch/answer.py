"""The function of an OpenAI batch job: one input line in, one output row out, in the shape `vllm
run-batch` writes (its BatchRequestOutput): `{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`, the body being the chat completion / completion / embedding list
forge serve answers.

A request the node refuses (a prompt too long, a model not served) is that line's answer: a row with
its status code, `body` null and `error` the OpenAI error object, as vLLM writes it. A failure that
is not the request's (an engine error, a node going down) raises instead, so the job treats it as
any function failure: an error row made OpenAI-shaped in the output (output.py), counted by
--max-errors; a node down stops the job with the line still to do in the ledger."""
from __future__ import annotations

import asyncio
import base64
import struct
import time
import uuid
from typing import Optional, Union

from pydantic import BaseModel

from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import FunctionSpec, GenerateParams
from forge.functions.llm import NodeLLM
from forge.node.interface import Node
from forge.openai_batch.lines import CHAT_URL, EmbeddingRequest, LineRefused, check_line
from forge.requests.messages import Chat
from forge.web.errors import error_body
from forge.serve.openai_api import (
    BadRequest,
    choice_object,
    decode_prompt,
    finish_of,
    guide_params,
    request_params,
    tier_limits,
    usage_of,
)

FUNCTION_NAME = "openai_batch"


def ok_row(custom_id: str, body: dict) -> dict:
    return {
        "id": f"forge-{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": f"forge-batch-{uuid.uuid4().hex}",
            "body": body,
        },
        "error": None,
    }


def error_row(custom_id: str, status: int, message: str, *, kind: Optional[str] = None,
              param: Optional[str] = None, row_id: Optional[str] = None) -> dict:
    return {
        "id": row_id or f"forge-{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": f"forge-batch-{uuid.uuid4().hex}",
            "body": None,
        },
        "error": error_body(status, kind, message, param),
    }


class BatchAnswerer:
    """The node is known once it is up (`node_up`); every line's request goes through the job's llm handle
    (counted, bounded, bulk priority like any function's), and the node applies its rules (the prompt's check,
    the chat template, guides, stop strings) as for forge serve's OpenAI API."""

    def __init__(self, models: dict[str, int], source: str):
        self.node: Optional[Node] = None
        self.tiers: dict[str, int] = {}
        self._models, self._source = models, source

    def node_up(self, node: Node) -> None:
        """Refuse, before any line runs, a model the node does not serve (one line naming where it is first asked)."""
        self.node, self.tiers = node, tier_limits(node)
        unknown = sorted((line, m) for m, line in self._models.items() if m not in self.tiers)
        if unknown:
            raise ForgeError(
                "\n".join(
                    f"{self._source}:{line}: model {m!r} is not served by node "
                    f"{node.name!r} "
                    f"(models: {', '.join(sorted(self.tiers))})"
                    for line, m in unknown[:20]
                )
            )

    async def __call__(self, record: dict, llm: NodeLLM) -> dict:
        try:
            custom_id, url, req = check_line(record)
        except LineRefused as e:  # checked before the run: only a file changed since gets here
            return error_row(str(record.get("custom_id")), 400, str(e), param=e.param)
        try:
            if req.model not in self.tiers:
                return error_row(
                    custom_id,
                    404,
                    f"model {req.model!r} is not served here (models: "
                    f"{', '.join(sorted(self.tiers))})",
                    kind="model_not_found",
                    param="model",
                )
            if isinstance(req, EmbeddingRequest):
                body = await self._embed(req, llm)
            else:
                body = await self._generate(url == CHAT_URL, req, llm)
            return ok_row(custom_id, body)
        except NodeDown:
            raise
        except (LineRefused, BadRequest) as e:
            return error_row(custom_id, 400, str(e), param=e.param)
        # the request's own problem (a prompt longer than any card takes, ...)
        except RequestRejected as e:
            return error_row(custom_id, 400, str(e), param=e.param)

    async def _generate(self, chat: bool, req: BaseModel, llm: NodeLLM) -> dict:
        """As forge serve's /v1/(chat/)completions answers it (forge/serve/openai_api.py), one choice a prompt."""
        choice, schema = guide_params(req)
        guided = choice is not None or schema is not None
        try:
            params = request_params(req, chat, self.tiers[req.model], choice, schema)
        except ValueError as e:           # a value no engine can represent (top_k 2**31, ...)
            raise LineRefused(str(e)) from None
        echo: list[str] = []
        prompts: list[Union[str, list[int], Chat]]
        # the node renders it: the model's template, or the plain transcript where it has none
        if chat:
            try:
                prompts = [
                    Chat.of(
                        [m.model_dump(include={"role", "content"}) for m in req.messages],
                        transcript_fallback=True,
                    )
                ]
            except RequestRejected as e:
                raise LineRefused(str(e), "messages") from None
        else:
            prompts = req.prompts
            if req.echo:
                echo = [
                    p if isinstance(p, str) else decode_prompt(self._node(), p) for p in prompts
                ]

        async def one(prompt):
            answer = await llm.submit(prompt, params)
            return answer.generation, answer.stop_reason

        out = await asyncio.gather(*(one(p) for p in prompts))
        choices = [
            choice_object(chat, j, gen, *finish_of(gen, matched, guided), echo[j] if echo else "")
            for j, (gen, matched) in enumerate(out)
        ]
        rid = ("chatcmpl-" if chat else "cmpl-") + (req.request_id or uuid.uuid4().hex[:24])
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": choices,
            "usage": usage_of(list(out), 1),
        }

    async def _embed(self, req: EmbeddingRequest, llm: NodeLLM) -> dict:
        """Each input's final hidden state; its prompt tokens are the node's count of what the engine read."""
        params = GenerateParams(max_tokens=1, embed=True)
        data, prompt_tokens = [], 0
        for i, text in enumerate(req.inputs):
            answer = await llm.submit(text, params)
            if answer.hidden is None:
                raise ForgeError(f"card {answer.generation.card}: its backend returns no hidden "
                                 "state")
            prompt_tokens += answer.generation.input_tokens
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": _encoded(answer.hidden, req.encoding_format),
                }
            )
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

    def _node(self) -> Node:
        if self.node is None:
            raise ForgeError("the OpenAI batch job answered a line before its node was up")
        return self.node


def _encoded(vector: list[float], encoding: str) -> Union[str, list[float]]:
    """OpenAI's encodings: a list of floats, or base64 of little-endian float32s."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return [float(v) for v in vector]


def batch_function(answerer: BatchAnswerer) -> FunctionSpec:
    """The job's function (no file: the ledger's run key hashes this module)."""

    async def openai_batch(record: dict, llm: NodeLLM) -> dict:
        return await answerer(record, llm)

    return FunctionSpec(fn=openai_batch, name=FUNCTION_NAME, extra={"node_up": answerer.node_up})
