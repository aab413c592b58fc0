"""uvicorn as forge runs it: without uvicorn's own signal handling, because forge drains its node
first; with bounded connections (forge/web/connections.py), a bounded request head, and one error
shape (forge/web/errors.py)."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Optional

MAX_REQUEST_HEAD_BYTES = 64 * 1024     # request line + headers (h11 refuses more with 400)


# What a client sends a JSON body as when it does not say JSON: no header at all, or curl -d's
# default form type.
_NOT_SAID = (b"", b"application/x-www-form-urlencoded", b"text/plain")


class JsonBodies:
    """Every body forge's servers take is JSON: one sent without a JSON content-type (none, `curl
    -d`'s form type, text/plain) is read as JSON rather than refused as "not a dictionary". A body
    that is not JSON is then refused as such, with the parser's message."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") in ("POST", "PUT", "PATCH"):
            headers = scope.get("headers") or []
            ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if ctype.split(b";")[0].strip().lower() in _NOT_SAID:
                scope = {
                    **scope,
                    "headers": [(k, v) for k, v in headers if k.lower() != b"content-type"]
                    + [(b"content-type", b"application/json")],
                }
        return await self.app(scope, receive, send)


class QuietServer:
    """A uvicorn server for `app` on host:port; `await .server.serve()`, stop with
    `.server.should_exit`. `.connections` holds its open connections by client address."""

    def __init__(self, app, host: str, port: int, *, limits=None, **config):
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from forge.web.connections import ConnectionBook, ConnectionLimits, limited_protocol
        from forge.web.errors import ErrorShape

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        self.connections = ConnectionBook(
            limits or ConnectionLimits(), backlog=config.pop("backlog", 2048)
        )
        config.update(backlog=self.connections.backlog)
        config.setdefault("h11_max_incomplete_event_size", MAX_REQUEST_HEAD_BYTES)
        limit = body_limit(app)
        self.server = Quiet(
            uvicorn.Config(
                ErrorShape(JsonBodies(limited_body(app, limit)), max_body_size=limit),
                host=host,
                port=port,
                log_level="warning",
                lifespan="off",
                access_log=False,
                http=limited_protocol(AutoHTTPProtocol, self.connections),
                **config,
            )
        )

    @property
    def port(self) -> int:
        """The port really bound (port 0 picks a free one)."""
        for s in self.server.servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return 0

    async def start(self) -> "asyncio.Task":
        """Serve in a task and return it once its socket is bound. A server that ends before (a port
        taken, an address this host does not have) raises NotServing with its reason."""
        task = asyncio.create_task(self._serve())
        while not self.server.started:
            if task.done():
                raise task.exception()
            await asyncio.sleep(0.02)
        return task

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        # uvicorn's way to fail at startup: sys.exit after logging the OSError
        except SystemExit as e:
            why = e.__context__
            raise NotServing(str(why) if why is not None else "it stopped at startup (exit "
                                                              f"{e.code})") from None


class NotServing(Exception):
    """The server ended before it could serve; the message is its reason."""


def body_limit(app) -> Optional[int]:
    """The app's body limit as built (`FastAPI(max_body_size=...)`): Starlette keeps it as an
    attribute, FastAPI 0.13x passes unknown arguments to `app.extra` and applies no limit itself."""
    limit = getattr(app, "max_body_size", None)
    if limit is None:
        limit = (getattr(app, "extra", None) or {}).get("max_body_size")
    return limit


def limited_body(app, limit: Optional[int]):
    """`app` behind Starlette's body-size limit (413 while a body without Content-Length streams
    past it), where the app did not already put it there; ErrorShape answers a declared
    Content-Length over it from the header."""
    if limit is None or getattr(app, "max_body_size", None) is not None:
        return app
    try:
        from starlette.middleware.body_limit import RequestBodyLimitMiddleware
    except ImportError:  # an older Starlette: the app's own limit applies (it keeps max_body_size)
        return app
    return RequestBodyLimitMiddleware(app, max_body_size=limit)
