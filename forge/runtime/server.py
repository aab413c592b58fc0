"""The node's control endpoint (FastAPI on uvicorn): what `forge deploy` clients and `forge top` talk to.

Bound to 127.0.0.1 unless configured otherwise; on any other address a bearer token is required to
start, and every /v1 request must carry it. Prometheus /metrics is served apart (read-only)."""
from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Optional, Union

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from forge.errors import ForgeError, RequestRejected
from forge.functions.api import GenerateParams

MAX_BATCH_REQUESTS = 1024        # requests in one POST /v1/generate


class GenerateItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: Union[str, list[int]]
    max_tokens: int = Field(gt=0)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: Optional[int] = None
    choice: Optional[list[str]] = None
    json_schema: Optional[dict] = None
    embed: bool = False
    priority: int = 0


class GenerateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[GenerateItem] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_token(host: str, token: Optional[str], token_env: str) -> None:
    """Refuse to expose a node beyond loopback without a token."""
    if not is_loopback(host) and not token:
        raise ForgeError(f"refusing to bind the control endpoint to {host} without a token: "
                         f"set ${token_env} (clients send it as 'Authorization: Bearer <token>')")


def build_app(node: Any, *, token: Optional[str] = None) -> FastAPI:
    """node: a NodeRuntime (submit/describe/engine_stats/broker_stats)."""
    app = FastAPI(title=f"forge node {node.name}", version="1", docs_url=None, redoc_url=None)
    expected = f"Bearer {token}".encode() if token else None

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if expected is not None and request.url.path.startswith("/v1"):
            got = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return JSONResponse({"error": {"type": "Unauthorized", "message": "missing or wrong bearer token"}},
                                    status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict:
        cards = node.healthy_cards()
        return {"node": node.name, "status": "ok" if cards and not node.closed else "degraded",
                "healthy_cards": cards}

    @app.get("/v1/node")
    async def describe() -> dict:
        return node.describe()

    @app.get("/v1/stats")
    async def stats() -> dict:
        from dataclasses import asdict

        b = node.broker_stats()
        return {"engines": [asdict(s) for s in node.engine_stats()],
                "broker": {**asdict(b), "padding_ratio": b.padding_ratio, "prefix_reuse_ratio": b.prefix_reuse_ratio}}

    @app.post("/v1/generate")
    async def generate(batch: GenerateBatch) -> dict:
        import asyncio

        async def one(item: GenerateItem) -> dict:
            params = GenerateParams(max_tokens=item.max_tokens, temperature=item.temperature, top_p=item.top_p,
                                    top_k=item.top_k, seed=item.seed,
                                    choice=tuple(item.choice) if item.choice is not None else None,
                                    json_schema=item.json_schema, embed=item.embed, priority=item.priority)
            try:
                gen, result = await node.submit(item.prompt, params)
            except ForgeError as e:
                return {"error": {"type": type(e).__name__, "message": str(e)}}
            out = {"text": gen.text, "output_tokens": gen.output_tokens, "input_tokens": gen.input_tokens,
                   "finish_reason": gen.finish_reason, "card": gen.card}
            if item.embed:
                out["hidden"] = result.hidden
            return out

        if node.closed:
            raise HTTPException(status_code=503, detail="node is draining")
        return {"results": await asyncio.gather(*(one(i) for i in batch.requests))}

    return app
