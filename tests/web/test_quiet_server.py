"""forge/web/server.py: a server that cannot bind says why as NotServing (uvicorn ends its startup
with sys.exit, which escaped the event loop as SystemExit before); one that can is serving when
start() returns."""
from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from forge.web.server import NotServing, QuietServer


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_taken_port_is_a_reason_not_an_exit():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def main():
            with pytest.raises(NotServing, match="address already in use"):
                await QuietServer(_app, "127.0.0.1", port).start()

        asyncio.run(main())


def test_a_started_server_answers_at_once():
    async def main():
        web = QuietServer(_app, "127.0.0.1", 0)
        task = await web.start()
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{web.port}/")).status_code
        finally:
            web.server.should_exit = True
            await asyncio.wait_for(task, 10)

    assert asyncio.run(main()) == 204
