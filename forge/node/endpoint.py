"""The node's control endpoint (FastAPI on uvicorn): what `forge deploy` clients and `forge top`
talk to.

Bound to 127.0.0.1 unless configured otherwise; on any other address a bearer token is required to
start, and every /v1 request must carry it. Prometheus /metrics is served apart (read-only). A
request whose client disconnects is cancelled: its generations are taken back from the broker or
cancelled in their engines (Node.submit, forge/node/interface.py). `forge serve` reuses these routes
and helpers."""
from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, Awaitable, ClassVar, Optional, Sequence

from fastapi import APIRouter, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

from forge import constants
from forge.errors import ForgeError
from forge.node.interface import Node, Prompt
from forge.requests import GenerateParams
from forge.requests.messages import Chat
from forge.machine.node_proof import Prover, is_loopback_host
from forge.web.errors import error_body, install_error_handlers, scrub_paths

MAX_BATCH_REQUESTS = 1024        # requests in one POST /v1/generate
# a bigger body is refused with 413 (from Content-Length, or while it streams in)
MAX_BODY_BYTES = 32 * 2**20
UTF8_MAX = 4                     # bytes per character, at most


def control_body_limit(node: Node) -> int:
    """The control endpoint's body limit: 32 MiB, or more where a batch of the longest prompts the node can take
    needs it (a bulk client must never meet 413 with prompts the node would accept)."""
    return max(MAX_BODY_BYTES, MAX_BATCH_REQUESTS * UTF8_MAX * node.prompt_chars_limit)


class GenerateItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # The most prompt tokens any card of the node takes: longer token ids (or more choices than any
    # engine takes) are that item's error from their length alone, before one of them is validated
    # (4M ids took seconds of the node's loop, /health included).
    max_prompt_tokens: ClassVar[int] = 2**31 - 1
    _refused: Optional[str] = PrivateAttr(None)
    # Text or token ids; anything else reaches Node.submit's prompt check, which names it as it does
    # in-process.
    prompt: Any = None
    # instead of a prompt: chat messages, made a prompt with the node's chat template (llm.chat on
    # forge deploy)
    messages: Optional[list[Any]] = Field(None, max_length=constants.MAX_CHAT_MESSAGES)
    # a model without a template gets the plain transcript (forge serve)
    transcript_fallback: bool = False
    max_tokens: int = Field(gt=0)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # Values past what an engine represents (top_k >= 2**31, a seed past 64 bits) are refused by
    # GenerateParams, per item: one bad record of a deploy batch fails alone.
    top_k: int = Field(0, ge=0)
    seed: Optional[int] = None
    choice: Optional[list[str]] = None
    json_schema: Optional[dict] = None
    embed: bool = False
    priority: int = 0
    deadline_s: Optional[float] = Field(None, gt=0)
    # cut by the node's submit
    stop: Optional[list[str]] = Field(None, max_length=constants.MAX_STOP_STRINGS)
    include_stop_str_in_output: bool = False

    @model_validator(mode="wrap")
    @classmethod
    def _bound_prompt(cls, data: Any, handler):
        if not isinstance(data, dict):
            return handler(data)
        prompt, choice = data.get("prompt"), data.get("choice")
        if isinstance(prompt, list) and len(prompt) > cls.max_prompt_tokens:
            item = handler({**data, "prompt": []})
            item._refused = (f"prompt: {len(prompt):,} token ids; no card here takes more than "
                             f"{cls.max_prompt_tokens:,} (its max_input_len)")
            return item
        messages = data.get("messages")
        if isinstance(messages, list) and len(messages) > constants.MAX_CHAT_MESSAGES:
            item = handler({**data, "messages": []})
            item._refused = (f"messages: {len(messages):,} chat messages; at most "
                             f"{constants.MAX_CHAT_MESSAGES:,} are taken")
            return item
        if isinstance(choice, list) and len(choice) > constants.MAX_GUIDE_CHOICES:
            item = handler({**data, "choice": None})
            item._refused = (f"choice has {len(choice):,} options; at most "
                             f"{constants.MAX_GUIDE_CHOICES:,} are taken")
            return item
        return handler(data)


class GenerateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[GenerateItem] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)


def batch_for(node: Node) -> type:
    """GenerateBatch whose items refuse prompts longer than the node's largest max_input_len from their length."""
    limit = max(
        (int(c["limits"]["max_input_len"]) for c in node.describe().get("cards", [])), default=0
    )
    if limit <= 0:
        return GenerateBatch
    item = type(
        "GenerateItem", (GenerateItem,), {"__module__": __name__, "max_prompt_tokens": limit}
    )
    return create_model("GenerateBatch", __base__=GenerateBatch, __module__=__name__,
                        requests=(list[item], Field(min_length=1, max_length=MAX_BATCH_REQUESTS)))


def require_token(host: str, token: Optional[str], token_env: str, what: str = "the control "
                                                                               "endpoint") -> None:
    """Refuse to expose a node beyond loopback without a token."""
    if not is_loopback_host(host) and not token:
        raise ForgeError(f"refusing to bind {what} to {host} without a token: "
                         f"set ${token_env} (clients send it as 'Authorization: Bearer <token>')")


class TokenAuth:
    """Pure ASGI middleware (no buffering, so streaming and disconnect detection still work): with a token set,
    every HTTP request whose path starts with one of `protected` must carry `Authorization: Bearer <token>`.
    Paths in `public` are always open (health checks)."""

    def __init__(self, app, *, token: Optional[str], protected: Sequence[str] = ("/v1",),
                 public: Sequence[str] = ("/health",)):
        self.app, self.protected, self.public = app, tuple(protected), tuple(public)
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send):
        if self.expected is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path.startswith(self.protected) and not path.startswith(self.public):
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                body = json.dumps(
                    error_body(401, "Unauthorized", "missing or wrong bearer token")
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its work was cancelled."""


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Run `work`; if the client disconnects first, cancel it (which takes its generations back) and raise
    ClientGone. Call it after the request body was read: the next ASGI message is then the disconnect."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:          # we are cancelled ourselves (deadline, shutdown): so is the work
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone("client disconnected")


def control_router(node: Node, prover: Optional[Prover] = None) -> APIRouter:
    """/health, /v1/node, /v1/stats and /v1/generate over a Node (forge/node/interface.py). With a prover,
    /health?challenge=... also answers the proof that this is the node its registry entry names
    (forge/machine/node_proof.py)."""
    router = APIRouter()

    @router.get("/health")
    async def health(challenge: Optional[str] = None) -> dict:
        cards = node.healthy_cards()
        out = {
            "node": node.name,
            "status": "ok" if cards and not node.closed else "degraded",
            "healthy_cards": cards,
        }
        answer = prover.answer(challenge) if prover is not None else None
        if answer is not None:
            out["proof"] = answer
        return out

    @router.get("/v1/node")
    async def describe() -> dict:
        return node.describe()

    @router.get("/v1/stats")
    async def stats() -> dict:
        from dataclasses import asdict

        b = node.broker_stats()
        return {
            "engines": [asdict(s) for s in node.engine_stats()],
            "broker": {
                **asdict(b),
                "padding_ratio": b.padding_ratio,
                "prefix_reuse_ratio": b.prefix_reuse_ratio,
            },
            "open_requests": node.open_requests(),
            "abandoned": node.abandoned,
        }

    async def generate(batch: GenerateBatch, request: Request) -> dict:
        async def one(item: GenerateItem) -> dict:
            if item._refused is not None:
                return {"error": {"type": "RequestRejected", "message": item._refused}}
            try:
                params = GenerateParams(
                    max_tokens=item.max_tokens,
                    temperature=item.temperature,
                    top_p=item.top_p,
                    top_k=item.top_k,
                    seed=item.seed,
                    choice=tuple(item.choice) if item.choice is not None else None,
                    json_schema=item.json_schema,
                    embed=item.embed,
                    priority=item.priority,
                    deadline_s=item.deadline_s,
                    stop=tuple(item.stop or ()),
                    include_stop_str_in_output=item.include_stop_str_in_output,
                )
                if (item.prompt is None) == (item.messages is None):
                    raise ForgeError("give a prompt or messages, not both nor neither")
                prompt: Prompt = item.prompt if item.messages is None else \
                    Chat.of(item.messages, transcript_fallback=item.transcript_fallback)
            # a value the parameters refuse: this item's mistake, not the batch's
            except (ValueError, ForgeError) as e:
                return {"error": {"type": "RequestRejected", "message": scrub_paths(str(e))}}
            try:
                gen, hidden, matched = await node.submit(prompt, params)
            except ForgeError as e:
                return {"error": {"type": type(e).__name__, "message": scrub_paths(str(e))}}
            out = {
                "text": gen.text,
                "output_tokens": gen.output_tokens,
                "input_tokens": gen.input_tokens,
                "finish_reason": gen.finish_reason,
                "card": gen.card,
                "token_ids": list(gen.token_ids),
            }
            if item.stop:
                out["stop_reason"] = matched
            if item.embed:
                out["hidden"] = hidden
            return out

        if node.closed:
            raise HTTPException(status_code=503, detail="node is draining")
        try:
            results = await until_disconnected(
                request, asyncio.gather(*(one(i) for i in batch.requests))
            )
        except ClientGone:
            raise HTTPException(status_code=499, detail="client disconnected") from None
        return {"results": results}

    # a class made here: a string annotation could not name it
    generate.__annotations__["batch"] = batch_for(node)
    router.post("/v1/generate")(generate)
    return router


def build_app(node: Node, *, token: Optional[str] = None, max_body_bytes: Optional[int] = None,
              prover: Optional[Prover] = None) -> FastAPI:
    """node: a Node (forge/node/interface.py); prover: the node's proof of itself (forge/machine/node_proof.py)."""
    app = FastAPI(
        title=f"forge node {node.name}",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        max_body_size=max_body_bytes or control_body_limit(node),
    )
    app.include_router(control_router(node, prover))
    install_error_handlers(app)
    app.add_middleware(TokenAuth, token=token)
    return app
