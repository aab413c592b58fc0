"""One error shape for every HTTP answer forge gives, on `forge serve` and on a node's control
endpoint: OpenAI's, `{"error": {"message", "type", "param", "code"}}` (`code` is the HTTP status, as
vLLM sends it). Body parse errors, validation errors, unknown routes, wrong methods, oversized
bodies and unexpected failures all answer in it, and no message shows a server path: a path (one
whose first component is a directory on this machine) below the working directory or an import root
is shown relative to it, any other as its last component."""
from __future__ import annotations

import http
import json
import logging
import os
import re
import sys
from typing import Any, Optional

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("forge.http")
MAX_MESSAGE_CHARS = 2000
KIND_BY_STATUS = {
    400: "invalid_request_error",
    401: "Unauthorized",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "request_timeout",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "overloaded",
    499: "client_closed",
    503: "unavailable",
    504: "deadline_exceeded",
}
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"()\[\]{}<>:,;=|]+/)+[^\s/'\"()\[\]{}<>:,;=|]*")
_ROUTES = ("/v1/", "/health", "/docs", "/openapi.json", "/metrics")


def _roots() -> list[str]:
    roots = {os.getcwd(), os.path.expanduser("~")} | {p for p in sys.path if os.path.isabs(p)}
    return sorted((r.rstrip("/") for r in roots if len(r) > 1), key=len, reverse=True)


def _shown(path: str) -> str:
    if path.startswith(_ROUTES) or not os.path.isdir("/" + path.split("/")[1]):
        return path                  # a route, or a URL path: not a place on this machine
    for root in _roots():
        if path.startswith(root + "/"):
            return path[len(root) + 1:]
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def scrub_paths(message: str) -> str:
    """The message with every absolute filesystem path made relative (or cut to its last component)."""
    return _PATH.sub(lambda m: _shown(m.group(0)), message)


def kind_of(status: int) -> str:
    return KIND_BY_STATUS.get(
        status, "internal_error" if status >= 500 else "invalid_request_error"
    )


def error_body(status: int, kind: Optional[str], message: str, param: Optional[str] = None) -> dict:
    message = scrub_paths(str(message))
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "…"
    return {
        "error": {
            "message": message,
            "type": kind or kind_of(status),
            "param": param,
            "code": status,
        }
    }


def error_response(status: int, kind: Optional[str], message: str, *, param: Optional[str] = None,
                   headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(
        error_body(status, kind, message, param), status_code=status, headers=headers
    )


def validation_message(errors: list[dict]) -> tuple[str, Optional[str]]:
    """(one line naming the field, the field) for pydantic's list of errors."""
    first = errors[0] if errors else {}
    kind, ctx = first.get("type", ""), first.get("ctx") or {}
    if kind == "json_invalid":
        pos = next((p for p in first.get("loc", ())[1:] if isinstance(p, int)), None)
        return f"the body is not valid JSON: {ctx.get('error', 'decode error')}" + \
            (f" at position {pos}" if pos is not None else ""), None
    if "param" in ctx:  # forge's own refusals (unsupported or unknown parameters) name their field
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return first.get("msg", "invalid"), f"{where}.{ctx['param']}" if where else ctx["param"]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{where}: {msg}{more}" if where else f"body: {msg}{more}"), where


def install_error_handlers(app: FastAPI) -> None:
    """Validation errors answer 400 (not FastAPI's 422 + list), HTTP errors and unknown routes answer in the
    shape, and an unexpected failure answers 500 naming only its type (the traceback goes to the server log)."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc: RequestValidationError):
        message, param = validation_message(list(exc.errors()))
        return error_response(400, "invalid_request_error", message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        status = exc.status_code
        if status == 404 and exc.detail == "Not Found":
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        elif status == 413:
            message = too_large(request.scope)
        # FastAPI's json.loads gave up
        elif status == 400 and isinstance(exc.__cause__, RecursionError):
            message = "the body is not valid JSON here: it is nested too deeply to parse"
        else:
            message = str(exc.detail) if exc.detail else http.HTTPStatus(status).phrase
        return error_response(status, None, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__}); the "
                                                     "server log has "
                                                     "the details")


class ErrorShape:
    """Outermost ASGI wrapper: an error answer that is not JSON (Starlette's plain-text 413 from the body limit,
    which replaces whatever the app answered when Content-Length is over the limit) is re-sent in the shape."""

    def __init__(self, app: Any, *, max_body_size: Optional[int] = None):
        self.app, self.max_body_size = app, max_body_size

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.max_body_size is not None and _declared_length(scope) > self.max_body_size:
            # answered from the header, the body never read: Starlette's own limit (1.x) checks
            # Content-Length only once the app reads the body, so a client announcing 400 MB and
            # sending nothing held the request open until the body deadline
            body = json.dumps(
                error_body(413, None, too_large({"starlette.max_body_size": self.max_body_size}))
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"connection", b"close"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        held: dict[str, Any] = {}

        async def shaped(message):
            if message["type"] == "http.response.start":
                headers = message.get("headers") or []
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if message["status"] >= 400 and not ctype.startswith(b"application/json"):
                    held.update(
                        status=message["status"],
                        body=b"",
                        headers=[
                            (k, v)
                            for k, v in headers
                            if k.lower() in (b"retry-after", b"allow", b"www-authenticate")
                        ],
                    )
                    return
            elif "status" in held and message["type"] == "http.response.body":
                held["body"] = (held["body"] + message.get("body", b""))[:MAX_MESSAGE_CHARS]
                if message.get("more_body"):
                    return
                status = held["status"]
                text = (
                    held["body"].decode("utf-8", "replace").strip()
                    or http.HTTPStatus(status).phrase
                )
                if status == 413:
                    text = too_large(scope)
                body = json.dumps(error_body(status, None, text)).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *held["headers"],
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, shaped)


def _declared_length(scope) -> int:
    """The request's Content-Length, or -1 (none, or not a number: the server's parser answers that)."""
    for k, v in scope.get("headers") or ():
        if k == b"content-length":
            return int(v) if v.isdigit() and len(v) <= 19 else -1
    return -1


def too_large(scope) -> str:
    limit = scope.get("starlette.max_body_size")
    return "the request body is larger than this server accepts" + \
        (f" ({limit / 2**20:g} MiB)" if isinstance(limit, int) else "")
