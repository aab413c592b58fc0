"""The `forge serve` application: function endpoints, OpenAI-compatible generation, the node's
control routes (so `forge deploy` can run a bulk job on the same node, at bulk priority), an OpenAPI
document, one FastAPI app on uvicorn. Loopback by default; anywhere else a bearer token is required
for everything but /health."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from fastapi import FastAPI

from forge.web.server import NotServing, QuietServer
from forge.functions.api import FunctionSpec
from forge.node.endpoint import MAX_BODY_BYTES, TokenAuth, control_router
from forge.node.interface import Node
from forge.node.serve_loop import serve_until_stopped
from forge.web.connections import DEFAULT_PER_CLIENT, ConnectionLimits
from forge.web.errors import error_body, install_error_handlers
from forge.serve.functions_api import function_router
from forge.serve.limits import CONCURRENCY_FACTOR, DEFAULT_DEADLINE_S, EndpointGate, node_slots
from forge.serve.openai_api import openai_router

log = logging.getLogger("forge.serve")
DRAIN_TIMEOUT_S = 30.0
SWITCH_INTERVAL_S = 0.0005   # see serve_embedded
# idle keep-alive connections live this long (longer than a loaded request takes)
KEEP_ALIVE_S = 75.0
OPENAI_ENDPOINTS = ("completions", "chat")


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8471
    token: Optional[str] = None
    concurrency_factor: int = CONCURRENCY_FACTOR
    max_concurrency: Optional[int] = None          # per endpoint; default factor x the node's slots
    default_deadline_s: float = DEFAULT_DEADLINE_S
    ready_file: Optional[str] = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_connections_per_client: int = DEFAULT_PER_CLIENT     # 0: no per-address bound


def make_gates(
    node: Node, specs: Sequence[FunctionSpec], opts: ServeOptions
) -> dict[str, EndpointGate]:
    limit = opts.max_concurrency or opts.concurrency_factor * node_slots(node.describe())
    gates = {name: EndpointGate(f"/v1/{'chat/' if name == 'chat' else ''}completions", limit)
             for name in OPENAI_ENDPOINTS}
    for spec in specs:
        gates[spec.name] = EndpointGate(
            f"/v1/functions/{spec.name}", min(limit, spec.concurrency or limit)
        )
    return gates


def build_serve_app(node: Node, specs: Sequence[FunctionSpec], opts: ServeOptions) -> FastAPI:
    names = [s.name for s in specs]
    clash = {n for n in names if names.count(n) > 1}
    if clash:
        from forge.errors import UsageError

        raise UsageError(f"two functions are named {', '.join(sorted(clash))}; serve them under "
                         "distinct names")
    gates = make_gates(node, specs, opts)
    app = FastAPI(title=f"forge serve — node {node.name}", version="1",
                  description="Deployed forge functions (one endpoint each), OpenAI-compatible "
                              "completions, and "
                              "the node's control routes. 429 + Retry-After when an endpoint is "
                              "full; "
                              "X-Forge-Deadline (seconds) bounds a request.",
                  max_body_size=opts.max_body_bytes)
    app.include_router(
        function_router(node, specs, gates, default_deadline_s=opts.default_deadline_s)
    )
    app.include_router(openai_router(node, gates, default_deadline_s=opts.default_deadline_s))
    if node.remote_url is None:               # a node in this process: its control routes too
        app.include_router(control_router(node), tags=["node"])
    else:                                     # a remote node keeps its own control endpoint
        @app.get("/health", tags=["node"])
        async def health() -> dict:
            return {
                "node": node.name,
                "status": "degraded" if node.closed else "ok",
                "remote": node.remote_url,
            }

    @app.get("/v1/serve", tags=["node"])
    async def serve_stats() -> dict:
        """Per endpoint: limit, in progress, admitted, refused (429), completed, failed, latency EWMA; and the
        server's connections (open, by how many client addresses, evicted, refused, closed without a request)."""
        book = getattr(app.state, "connections", None)
        return {"node": node.name, "endpoints": {g.name: g.stats() for g in gates.values()},
                "open_requests": node.open_requests(), "abandoned": node.abandoned,
                "functions": names, "connections": book.stats() if book is not None else None}

    install_error_handlers(app)
    app.state.gates = gates
    app.add_middleware(EarlyRefusal, gates={g.name: g for g in gates.values()})
    # outermost
    app.add_middleware(TokenAuth, token=opts.token, protected=("/",), public=("/health",))
    return app


class EarlyRefusal:
    """Under overload the refusal must stay cheap: a POST to a full endpoint gets its 429 here, before routing and
    body parsing. (The endpoint's own gate still decides for requests that get through.)"""

    def __init__(self, app, *, gates: dict[str, EndpointGate]):
        self.app, self.gates = app, gates

    async def __call__(self, scope, receive, send):
        gate = (
            self.gates.get(scope.get("path", ""))
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if gate is None or gate.active < gate.limit:
            return await self.app(scope, receive, send)
        gate.refused += 1
        body = json.dumps(error_body(429, "overloaded", f"{gate.name}: {gate.active} requests in "
                                                        "progress (limit "
                                                        f"{gate.limit}); retry later"))
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"),
                                (b"retry-after", str(gate.retry_after_s()).encode())]})
        await send({"type": "http.response.body", "body": body.encode()})


async def serve_node(node: Node, specs: Sequence[FunctionSpec], opts: ServeOptions, *,
                     stop: Optional[asyncio.Event] = None) -> int:
    """Serve an already started node until SIGINT/SIGTERM (or `stop`), then drain and stop it."""
    from forge.errors import ForgeError

    app = build_serve_app(node, specs, opts)
    web = QuietServer(app, opts.host, opts.port, backlog=4096, timeout_keep_alive=KEEP_ALIVE_S,
                      limits=ConnectionLimits(per_client=opts.max_connections_per_client))
    app.state.connections = web.connections
    try:
        task = await web.start()
    except NotServing as e:
        await node.stop()
        raise ForgeError(f"forge serve could not bind {opts.host}:{opts.port}: {e}") from None
    url = f"http://{opts.host}:{web.port}"
    print(f"forge: serving {', '.join(s.name for s in specs) or 'no function'} + OpenAI-compatible "
          "/v1 on "
          f"node {node.name} at {url} (OpenAPI: {url}/docs)", flush=True)
    if opts.ready_file:
        with open(opts.ready_file, "w") as f:
            f.write(url + "\n")
    return await serve_until_stopped(
        node, web, task, label=f"serve on node {node.name}", drain_s=DRAIN_TIMEOUT_S, stop=stop
    )


def serve_embedded(loaded, specs: Sequence[FunctionSpec], opts: ServeOptions) -> int:
    """Provision the node in this process and serve it (what `forge serve --node NODE.yaml` runs)."""
    from forge.node.local import LocalNode

    # The engines' loops are Python threads here; the HTTP loop does many short I/O steps, each of
    # which gives the GIL away and waits up to the switch interval (5 ms by default) to get it back.
    # Under thousands of connections that wait dominates, so hand the GIL over sooner.
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    async def main() -> int:
        t0 = time.monotonic()
        node = LocalNode(loaded)
        await node.start()
        log.info("node %s up in %.1f s", node.name, time.monotonic() - t0)
        return await serve_node(node, specs, opts)

    return asyncio.run(main())


def serve_remote(
    url: str, node_token: Optional[str], specs: Sequence[FunctionSpec], opts: ServeOptions
) -> int:
    """Serve against a node provisioned elsewhere (`forge serve --remote NODE`): the functions run here, their
    generations go to the node over HTTP, one POST each (forge/node/remote.py's RemoteNode, wait=False)."""
    from forge.node.remote import RemoteNode

    async def main() -> int:
        node = RemoteNode(url, token=node_token, max_connections=1024)
        try:
            await node.start()
        except BaseException:
            await node.stop()
            raise
        return await serve_node(node, specs, opts)

    return asyncio.run(main())
