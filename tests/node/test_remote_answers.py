"""What a remote node answers is checked where forge/node/remote.py parses it
(forge/node/answer_check.py), and a node that answers /health but never a POST holds a batch no
longer than the stall window: real HTTP servers on 127.0.0.1 that answer what a broken or hostile
node would."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

import pytest

from forge.errors import ForgeError, NodeDown
from forge.node.answer_check import BadAnswer
from forge.node.remote import RemoteNode
from forge.requests import GenerateParams

GOOD = {
    "text": "hi",
    "output_tokens": 2,
    "input_tokens": 3,
    "finish_reason": "length",
    "card": "cpu0",
    "token_ids": [5, 6],
}


class FakeNode:
    """A real HTTP server: /health ok, /v1/node, and `generate(n_requests) -> (status, body bytes)`
    for POSTs; `stats()` for /v1/stats (404 when None)."""

    def __init__(
        self, generate: Callable[[int], bytes], stats: Optional[Callable[[], dict]] = None
    ):
        self.release = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, b'{"node": "fake", "status": "ok", "healthy_cards": ["cpu0"]}')
                elif self.path == "/v1/node":
                    self._send(200, b'{"node": "fake", "cards": []}')
                elif self.path == "/v1/stats" and stats is not None:
                    self._send(200, json.dumps(stats()).encode())
                else:
                    self._send(404, b'{"error": "no"}')

            def do_POST(self):
                n = len(
                    json.loads(self.rfile.read(int(self.headers["content-length"])))["requests"]
                )
                self._send(200, generate(n))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def answering(result_text: str) -> Callable[[int], bytes]:
    """Every request of a POST answered with the same raw JSON text (NaN and 1e400 as a peer may
    write them)."""
    return lambda n: ('{"results": [' + ",".join([result_text] * n) + "]}").encode()


async def _one(url: str, **kw):
    node = RemoteNode(url, **kw)
    await node.start()
    try:
        return await node.submit("hello", GenerateParams(max_tokens=4))
    finally:
        await node.close()


def test_a_well_formed_answer_reaches_the_function():
    fake = FakeNode(answering(json.dumps(GOOD)))
    try:
        answer = asyncio.run(_one(fake.url))
    finally:
        fake.close()
    assert answer.generation.text == "hi" and answer.generation.token_ids == (5, 6)
    assert answer.generation.output_tokens == 2 and answer.generation.card == "cpu0"


def _with(**fields) -> str:
    raw = {**GOOD, **fields}
    return json.dumps(raw)


BAD_ANSWERS = {
    "text": _with(text=["x"]),
    "output_tokens": _with(output_tokens=-5),
    "token_ids": _with(token_ids="abc"),
    "input_tokens": _with(input_tokens=float("nan")),  # json.dumps writes NaN: a peer may too
    "output_tokens ": _with(output_tokens=1e400),               # Infinity
    "output_tokens  ": _with(output_tokens=True),
    "output_tokens   ": _with(output_tokens=2.0),
    "token_ids ": _with(token_ids=[1, -2]),
    "finish_reason": _with(finish_reason=None),
    "text ": json.dumps({k: v for k, v in GOOD.items() if k != "text"}),
    "error": json.dumps({"error": "x"}),
    "not an object": '"just a string"',
}


@pytest.mark.parametrize("field", BAD_ANSWERS)
def test_a_malformed_answer_is_that_requests_error_naming_the_field(field):
    fake = FakeNode(answering(BAD_ANSWERS[field]))
    try:
        with pytest.raises(BadAnswer) as caught:
            asyncio.run(_one(fake.url))
    finally:
        fake.close()
    message = str(caught.value)
    assert message.startswith("node fake answered a request with") and field.strip() in message, (
        message
    )
    assert not isinstance(caught.value, NodeDown)       # the request's error: the run goes on


def test_a_hidden_state_with_nan_is_refused():
    fake = FakeNode(answering(_with(hidden=[0.5, float("nan")])))
    try:
        async def embed():
            node = RemoteNode(fake.url)
            await node.start()
            try:
                return await node.submit("hello", GenerateParams(max_tokens=1, embed=True))
            finally:
                await node.close()

        with pytest.raises(BadAnswer, match="hidden"):
            asyncio.run(embed())
    finally:
        fake.close()


def test_a_node_that_never_answers_a_post_holds_a_batch_only_for_the_stall_window():
    holder: dict = {}

    def hang(n: int) -> bytes:
        # released at teardown: the POST never gets an answer before
        holder["fake"].release.wait(120)
        return b'{"results": []}'

    fake = holder["fake"] = FakeNode(hang)
    t0 = time.monotonic()
    try:
        with pytest.raises(NodeDown, match="answers /health but has answered no request") as caught:
            asyncio.run(_one(fake.url, stall_window_s=2.0))
    finally:
        fake.close()
    took = time.monotonic() - t0
    assert took < 8, (took, str(caught.value))         # not the POST's 600 s read timeout


def test_a_slow_answer_from_a_node_that_shows_progress_is_awaited():
    steps = {"n": 0}

    def stats() -> dict:
        steps["n"] += 1  # the engine steps on: the node works
        return {
            "engines": [{"card": "cpu0", "engine_steps": steps["n"]}],
            "broker": {"dispatched": 1},
            "open_requests": 1,
        }

    def slow(n: int) -> bytes:
        time.sleep(5)                           # more than twice the stall window
        return answering(json.dumps(GOOD))(n)

    fake = FakeNode(slow, stats)
    try:
        answer = asyncio.run(_one(fake.url, stall_window_s=2.0))
    finally:
        fake.close()
    assert answer.generation.text == "hi" and steps["n"] >= 2


def test_forge_error_is_the_base_of_a_bad_answer():
    assert issubclass(BadAnswer, ForgeError)
