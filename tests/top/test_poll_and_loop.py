"""forge.top.poll against answers a node can give (httpx MockTransport), and the live loop's pacing
of misses. The real node is exercised in test_top_live_node.py."""
from __future__ import annotations

import io
import socket

import httpx
import pytest
from rich.console import Console

from forge.errors import ForgeError
from forge.top import live
from forge.top.poll import NodeUnreachable, Poller

STATS = {
    "engines": [
        {
            "node": "n",
            "card": "cpu0",
            "tier": "t",
            "token_budget": 8,
            "slots": 2,
            "kv_blocks_total": 4,
            "timestamp": 1.0,
            "healthy": True,
        }
    ],
    "broker": {"pending": 0},
}


def poller(handler) -> Poller:
    return Poller("http://node:1", name="n", token="s3cret", token_env="MY_TOKEN",
                  transport=httpx.MockTransport(handler))


def test_sample_reads_health_and_stats_with_the_token():
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.path, req.headers.get("authorization")))
        return httpx.Response(
            200, json={"node": "n", "status": "ok"} if req.url.path == "/health" else STATS
        )

    s = poller(handler).sample()
    assert s.health["status"] == "ok" and s.stats == STATS
    assert seen == [("/health", "Bearer s3cret"), ("/v1/stats", "Bearer s3cret")]


@pytest.mark.parametrize("response, message", [
    (httpx.Response(401), "node n at http://node:1 refused the token: set $MY_TOKEN"),
    (httpx.Response(500), "node n at http://node:1: GET /health answered HTTP 500"),
    (httpx.Response(200, text="<html>"), "http://node:1/health: the answer is not a JSON object"),
])
def test_bad_answers_are_one_line(response, message):
    with pytest.raises(ForgeError) as e:
        poller(lambda req: response).sample()
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not isinstance(e.value, NodeUnreachable)


def test_stats_of_another_shape_is_refused():
    p = poller(lambda req: httpx.Response(200, json={"engines": {}}))
    with pytest.raises(ForgeError, match="expected 'engines' \\(list\\) and 'broker'"):
        p.sample()


def test_a_closed_port_is_unreachable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # nothing listens once closed
    with pytest.raises(NodeUnreachable, match=f"node at http://127.0.0.1:{port} is unreachable"):
        Poller(f"http://127.0.0.1:{port}", name=f"http://127.0.0.1:{port}").sample()


class FlakyPoller:
    """Answers `good` times, then fails `bad` times, then answers again."""

    url = "http://node:1"
    label = "node n at http://node:1"

    def __init__(self, good: int, bad: int):
        self.calls, self.good, self.bad = 0, good, bad

    def sample(self):
        self.calls += 1
        if self.good < self.calls <= self.good + self.bad:
            raise NodeUnreachable("node n at http://node:1 is unreachable: refused", "refused")
        stats = {"engines": [{**STATS["engines"][0], "timestamp": float(self.calls),
                              "output_tokens": 10 * self.calls}], "broker": {}}
        return live.Sample(at=0.0, health={"node": "n", "status": "ok"}, stats=stats)


def frames(p, n: int) -> str:
    console = Console(width=160, record=True, color_system=None, file=io.StringIO())
    live.run_live(p, console, 0.001, max_frames=n)
    return console.export_text()


def test_a_missed_poll_is_shown_and_the_view_recovers():
    text = frames(FlakyPoller(good=2, bad=live.MAX_MISSED_POLLS - 1), 6)
    assert text.count("no answer: refused (showing the last one; retry 1/2)") == 1
    assert text.count("retry 2/2") == 1
    assert text.strip().splitlines()[-1].split()[3] == "10"  # last frame: 10 generated tok/s again


def test_a_node_that_stays_away_ends_top_with_one_line():
    with pytest.raises(NodeUnreachable) as e:
        frames(FlakyPoller(good=1, bad=100), 100)
    n = live.MAX_MISSED_POLLS
    assert (
        str(e.value) == f"node n at http://node:1 stopped answering ({n} polls in a row): refused"
    )
