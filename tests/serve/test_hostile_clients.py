"""Hostile clients against both of forge's HTTP servers (`forge serve` and `forge provision`'s
control endpoint), real subprocesses on the instant node, real HTTP and raw sockets (issue 29, rows
10 and 11 and the serve items): a huge body is refused at a bounded cost while /health keeps
answering; every request head and body on a keep-alive connection has a deadline; bad guides and
seeds answer 400 naming what the client sent."""
from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time

import httpx
import pytest

from tests.serve.test_http_limits import Server, shaped

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=["provision", "serve"])
def server(request, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp(request.param), request.param)
    yield s
    assert s.stop() == 0, s.err.read_text()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), "serve")
    yield s
    assert s.stop() == 0, s.err.read_text()


def _parse_s(body: bytes) -> float:
    """Seconds one json.loads of `body` takes here, now: the loop may spend about that, and no more,
    on it (the machine is shared: its speed is measured, not assumed)."""
    t0 = time.monotonic()
    json.loads(body)
    return time.monotonic() - t0


def _health_while(url: str, post) -> tuple[float, httpx.Response]:
    """Run post() in a thread; meanwhile ask /health every 50 ms. (the slowest /health answer in s,
    post's answer)"""
    got: dict = {}
    thread = threading.Thread(target=lambda: got.setdefault("r", post()), daemon=True)
    worst = 0.0
    with httpx.Client(timeout=60) as client:
        client.get(url + "/health")
        thread.start()
        while thread.is_alive():
            t0 = time.monotonic()
            assert client.get(url + "/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
    thread.join()
    return worst, got["r"]


# --- row 10: request validation at a bounded cost
# ----------------------------------------------------------------
def _token_ids_body(server) -> tuple[str, bytes]:
    ids = [i % 100 for i in range(4_000_000)]                    # "12," x 4M: a 12 MB body
    if server.command == "serve":
        return "/v1/completions", json.dumps(
            {"model": "instant-tiny", "prompt": ids, "max_tokens": 2}
        ).encode()
    return "/v1/generate", json.dumps({"requests": [{"prompt": ids, "max_tokens": 2}]}).encode()


def test_a_body_of_four_million_token_ids_does_not_stall_health(server):
    path, body = _token_ids_body(server)
    assert 10e6 < len(body) < 16e6
    worst, r = _health_while(
        server.url,
        lambda: httpx.post(
            server.url + path,
            content=body,
            timeout=120,
            headers={"content-type": "application/json"},
        ),
    )
    bound = max(1.0, 3 * _parse_s(body))
    assert worst < bound, (
        f"/health took {worst:.2f} s while the body was checked (bound {bound:.2f} s)"
    )
    if server.command == "serve":
        err = shaped(r, 400)
        assert err["param"] == "prompt" and "4,000,000 token ids" in err["message"], err
    else:  # one item of a deploy batch: that item's error, the batch answers
        assert r.status_code == 200, r.text
        err = r.json()["results"][0]["error"]
        assert err["type"] == "RequestRejected" and "4,000,000 token ids" in err["message"], err


def test_a_chat_of_200k_messages_does_not_stall_health(serve):
    body = json.dumps({"model": "instant-tiny", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}] * 200_000}).encode()
    worst, r = _health_while(
        serve.url,
        lambda: httpx.post(
            serve.url + "/v1/chat/completions",
            content=body,
            timeout=120,
            headers={"content-type": "application/json"},
        ),
    )
    bound = max(1.0, 3 * _parse_s(body))
    assert worst < bound, (
        f"/health took {worst:.2f} s while the body was checked (bound {bound:.2f} s)"
    )
    err = shaped(r, 400)
    assert err["param"] == "messages" and "200,000 messages" in err["message"], err


# --- row 11: a deadline on every head and body, on every request of a connection
# -----------------------------------
def _trickle_until_closed(
    sock: socket.socket, pieces: bytes, limit_s: float
) -> tuple[float, bytes]:
    """Send `pieces` a byte a second until the server closes; (seconds it took, what the server
    sent)."""
    t0, answer = time.monotonic(), b""
    sock.settimeout(1.0)
    for i in range(int(limit_s)):
        try:
            sock.sendall(pieces[i % len(pieces):i % len(pieces) + 1])
        except OSError:
            break
        try:
            got = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not got:
            break
        answer += got
    return time.monotonic() - t0, answer


def _one_request(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    sock.settimeout(10)
    answer = b""
    while not answer.rstrip().endswith(b"}"):
        got = sock.recv(65536)
        assert got, answer
        answer += got
    return answer


def _slow_head(server) -> tuple[float, bytes]:
    with socket.create_connection((server.host, server.port)) as sock:
        # keep-alive: the connection stays open
        assert _one_request(sock).startswith(b"HTTP/1.1 200")
        return _trickle_until_closed(sock, b"GET /health HTTP/1.1\r\nhost: x\r\n", limit_s=40)


def _slow_body(server) -> tuple[float, bytes]:
    path = b"/v1/completions" if server.command == "serve" else b"/v1/generate"
    with socket.create_connection((server.host, server.port)) as sock:
        assert _one_request(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100000\r\n\r\n{")
        return _trickle_until_closed(sock, b'"x": 1, ', limit_s=40)


def test_a_slow_second_request_head_and_a_slow_body_are_each_closed_in_bounded_time(server):
    """Two slow clients at once, one on each deadline: each connection's clock is its own."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        head, body = pool.submit(_slow_head, server), pool.submit(_slow_body, server)
        (head_s, head_answer), (body_s, body_answer) = (
            head.result(timeout=120),
            body.result(timeout=120),
        )
    assert head_s < 16, f"a head trickling a byte a second stayed open {head_s:.0f} s"
    assert head_answer.startswith(b"HTTP/1.1 408") and b"request head" in head_answer, head_answer
    assert body_s < 16, f"a body trickling a byte a second stayed open {body_s:.0f} s"
    assert body_answer.startswith(b"HTTP/1.1 408") and b"request body" in body_answer, body_answer
    assert httpx.get(server.url + "/health").status_code == 200
