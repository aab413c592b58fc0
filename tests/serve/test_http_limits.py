"""Both of forge's HTTP servers (`forge serve` and a node's control endpoint from `forge
provision`), over real HTTP and raw sockets: every error in OpenAI's shape (unknown routes, wrong
methods, bad JSON, validation errors), no server paths in messages, a body-size limit (413, from
Content-Length at once and while a chunked body streams in), and bounded connections: a flood of
idle sockets beyond the process's descriptor budget, from one address, leaves /health answering."""
from __future__ import annotations

import asyncio
import json
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import REPO

INSTANT = REPO / "tests" / "reliability" / "fixtures" / "nodes" / "instant.yaml"
SHAPE = {"message", "type", "param", "code"}
_ROOTS = sorted({"/" + Path(p).parts[1] for p in (REPO, sys.prefix, "/tmp", Path.home())})
# e.g. /work/, /usr/
SERVER_PATH = re.compile("(?<![\\w.:/])(" + "|".join(map(re.escape, _ROOTS)) + ")/")


def shaped(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == SHAPE and err["code"] == status, err
    assert not SERVER_PATH.search(err["message"]) and str(REPO) not in err["message"], err[
        "message"
    ]
    return err


def _limit_fds(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


class Server:
    """`forge provision` or `forge serve` on the instant node (no model), in a subprocess, optionally with a
    small descriptor limit."""

    def __init__(self, tmp: Path, command: str, *args: str, fds: int | None = None):
        self.command = command
        ready = tmp / f"{command}.url"
        argv = [
            sys.executable,
            "-m",
            "forge",
            command,
            *(
                ["--node", str(INSTANT)]
                if command == "serve"
                else [str(INSTANT), "--metrics-port", "0"]
            ),
            "--port",
            "0",
            "--ready-file",
            str(ready),
            *args,
        ]
        self.err = tmp / f"{command}.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**__import__("os").environ, "FORGE_HOME": str(tmp)},
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=_limit_fds(fds) if fds else None,
            )
        deadline = time.monotonic() + 90
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert self.proc.poll() is None, self.err.read_text()
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.05)
        self.url = ready.read_text().strip()
        self.host, port = self.url.split("//")[1].rsplit(":", 1)
        self.port = int(port)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture(scope="module", params=["provision", "serve"])
def server(request, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp(request.param), request.param)
    yield s
    assert s.stop() == 0, s.err.read_text()


def test_every_error_answers_in_one_shape(server):
    u = server.url
    assert (
        shaped(httpx.get(u + "/no/such/route"), 404)["message"]
        == "Invalid URL (GET /no/such/route)"
    )
    shaped(httpx.post(u + "/health"), 405)
    err = shaped(
        httpx.post(
            u + "/v1/generate",
            content=b'{"requests": [',
            headers={"content-type": "application/json"},
        ),
        400,
    )
    assert (
        err["message"].startswith("the body is not valid JSON")
        and err["type"] == "invalid_request_error"
    )
    err = shaped(
        httpx.post(u + "/v1/generate", json={"requests": [{"prompt": "x", "max_tokens": 0}]}), 400
    )
    assert err["param"] == "requests.0.max_tokens" and "greater than 0" in err["message"]
    shaped(httpx.post(u + "/v1/generate", json={"requests": []}), 400)
    r = httpx.post(
        u + "/v1/generate", json={"requests": [{"prompt": "x", "max_tokens": 2, "top_k": 2**31}]}
    )
    # beyond an engine's int32: that item's error, not the batch's
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["error"]["type"] == "RequestRejected" and "top_k" in r.text


def test_error_messages_show_no_server_paths(server):
    r = httpx.post(
        server.url + "/v1/generate", json={"requests": [{"prompt": "word " * 600, "max_tokens": 2}]}
    )
    assert r.status_code == 200
    err = r.json()["results"][0]["error"]
    assert "max_input_len 384" in err["message"] and not SERVER_PATH.search(err["message"]), err
    assert str(REPO) not in err["message"]


def _raw(server, head: bytes, chunks=(), timeout: float = 10.0) -> bytes:
    """Send a request head (and chunks, stopping when the server stops reading) and return the answer."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as c:
        c.sendall(head)
        try:
            for chunk in chunks:
                c.sendall(chunk)
        except OSError:
            pass                    # the server answered and closed while we were still sending
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            got = c.recv(65536)
            if not got:
                break
            answer += got
        return answer


def _error(answer: bytes) -> dict:
    err = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(err) == SHAPE, err
    return err


def test_body_over_the_limit_gets_413(server):
    t0 = time.monotonic()
    answer = _raw(
        server,
        b"POST /v1/generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 400000000\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 413") and _error(answer)["type"] == "request_too_large", (
        answer
    )
    assert time.monotonic() - t0 < 5                 # answered from the header, body never read
    piece = b"[" + b"1," * (2**20 // 2 - 1) + b"1]"  # 1 MiB, chunked: no Content-Length to go by
    answer = _raw(
        server,
        b"POST /v1/generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n",
        (b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(40)),
    )
    assert answer.startswith(b"HTTP/1.1 413") and _error(answer)["code"] == 413, answer[:300]
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("command", ["provision", "serve"])
def test_idle_socket_flood_leaves_health_answering(tmp_path, command):
    """1,500 idle connections against a server allowed 1,024 descriptors: without a bound, accept() fails
    (EMFILE, which stops accepting for a second each time) and /health stops answering; with it, the oldest idle
    sockets are closed to make room, and a burst of accepts stays within the descriptors kept free for it."""
    s = Server(tmp_path, command, fds=1024)
    socks = []
    try:
        for _ in range(1500):
            socks.append(socket.create_connection((s.host, s.port)))
        t0 = time.monotonic()
        r = httpx.get(s.url + "/health", timeout=10)
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        closed = 0
        for c in socks:
            c.setblocking(False)
            try:
                closed += c.recv(1) == b""
            except BlockingIOError:
                pass
        # at most 1024 - 256 (reserve) - 256 (backlog) stay open
        assert closed >= 1500 - 512, closed
        if command == "serve":
            book = httpx.get(s.url + "/v1/serve").json()["connections"]
            assert book["open"] <= book["limit_total"] == 512 and book["evicted"] >= closed, book
    finally:
        for c in socks:
            c.close()
        assert s.stop() == 0, s.err.read_text()
    assert "Too many open files" not in s.err.read_text()  # accept() never ran out of descriptors


def test_per_client_bound_and_silent_sockets_closed():
    """Per address at most N connections (the oldest idle one makes room); a socket that sends no request
    within first_request_s is closed. Real uvicorn on a minimal app."""
    from fastapi import FastAPI

    from forge.web.connections import ConnectionLimits
    from forge.web.server import QuietServer

    app = FastAPI()
    app.get("/health")(lambda: {"ok": True})
    web = QuietServer(
        app, "127.0.0.1", 0, limits=ConnectionLimits(per_client=50, first_request_s=0.5)
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(web.server.serve()), daemon=True
    )
    thread.start()
    while not web.server.started:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{web.port}"
    socks = [socket.create_connection(("127.0.0.1", web.port)) for _ in range(200)]
    try:
        assert httpx.get(url + "/health").status_code == 200
        assert web.connections.open <= 50 and web.connections.evicted >= 150
        time.sleep(1.0)
        assert web.connections.open == 0 and web.connections.stats()["closed_without_request"] >= 1
        with httpx.Client(base_url=url) as kept:  # a connection that does speak stays open
            assert kept.get("/health").status_code == 200
            time.sleep(0.8)
            assert kept.get("/health").status_code == 200 and web.connections.open == 1
    finally:
        for c in socks:
            c.close()
        web.server.should_exit = True
        thread.join(10)


def test_scrub_paths_keeps_routes_and_urls():
    import os

    from forge.web.errors import scrub_paths

    site = next(p for p in sys.path if p.endswith("site-packages"))
    msg = (f"boom (at {site}/transformers/x.py:12 in f); tokenizer "
           f"{os.getcwd()}/forge/embedded/tiny-llama; "
           "other /usr/lib/nowhere-forge/python; /v1/completions: full; Invalid URL (GET "
           "/no/such/route); "
           f"see http://127.0.0.1:8471/v1/models")
    assert scrub_paths(msg) == ("boom (at transformers/x.py:12 in f); tokenizer "
                                "forge/embedded/tiny-llama; "
                                "other python; /v1/completions: full; Invalid URL (GET "
                                "/no/such/route); "
                                "see http://127.0.0.1:8471/v1/models")


def test_control_endpoint_body_limit_fits_a_full_batch_of_the_longest_prompts():
    from types import SimpleNamespace

    from forge.node.endpoint import MAX_BATCH_REQUESTS, MAX_BODY_BYTES, control_body_limit

    # the tiny node
    assert control_body_limit(SimpleNamespace(prompt_chars_limit=4_992)) == MAX_BODY_BYTES
    assert (
        control_body_limit(SimpleNamespace(prompt_chars_limit=61_440))
        == MAX_BATCH_REQUESTS * 4 * 61_440
    )
