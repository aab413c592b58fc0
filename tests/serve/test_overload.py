"""Overload is an answer: 429 + Retry-After past the endpoint's bound, 504 past a deadline, and a
client that leaves takes its engine work with it. Online requests overtake a bulk job on the same
node."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.serve.conftest import ServedNode, wait_settled

pytestmark = pytest.mark.engine
MODEL = "tiny-llama-cpu"
LONG = "1, 2, 3, 4, 5, 6, 7,"  # the tiny model counts on for ~90 tokens (greedy) before it stops
SETTLED = {"open_requests": 0, "pending": 0, "in_flight": 0, "kv_reserved": 0, "gate_active": 0}


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    s = ServedNode(max_concurrency=4).start(tmp_path_factory.mktemp("tight"))
    yield s
    s.close()


def completion(max_tokens: int, prompt: str = "Alice was beginning to", **kw) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}


def test_a_full_endpoint_answers_429_with_retry_after(tight):
    async def main():
        async with httpx.AsyncClient(base_url=tight.url, timeout=60) as http:
            return await asyncio.gather(
                *(http.post("/v1/completions", json=completion(64)) for _ in range(24))
            )

    rs = asyncio.run(main())
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 4, codes
    for r in rs:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "overloaded"
    gate = httpx.get(tight.url + "/v1/serve").json()["endpoints"]["/v1/completions"]
    assert gate["limit"] == 4 and gate["refused"] >= codes.count(429)
    assert wait_settled(tight.url) == SETTLED


def test_a_deadline_answers_504_and_cancels_the_work(tight):
    before = tight.call(
        lambda: sum(s.requests_cancelled + s.requests_failed for s in tight.node.engine_stats())
    )
    t0 = time.monotonic()
    rs = [
        httpx.post(
            tight.url + "/v1/completions",
            json=completion(128, LONG),
            headers={"x-forge-deadline": "0.05"},
            timeout=30,
        )
        for _ in range(2)
    ]
    rs.append(
        httpx.post(
            tight.url + "/v1/completions", json=completion(128, LONG, deadline_s=0.05), timeout=30
        )
    )
    assert [r.status_code for r in rs] == [504, 504, 504] and time.monotonic() - t0 < 10
    assert rs[0].json()["error"]["type"] == "deadline_exceeded"
    assert wait_settled(tight.url) == SETTLED
    after = tight.call(
        lambda: sum(s.requests_cancelled + s.requests_failed for s in tight.node.engine_stats())
    )
    assert after - before >= 3                      # each one was stopped in (or before) the engine


def test_a_client_that_leaves_takes_its_work_back(tight):
    abandoned0 = httpx.get(tight.url + "/v1/serve").json()["abandoned"]

    async def main():
        async with httpx.AsyncClient(base_url=tight.url, timeout=60) as http:
            tasks = [
                asyncio.ensure_future(http.post("/v1/completions", json=completion(128, LONG)))
                for _ in range(3)
            ]
            stream = http.stream("POST", "/v1/completions", json=completion(128, LONG, stream=True))
            async with stream as r:
                assert r.status_code == 200  # admitted (headers go out before the work starts)
                await asyncio.sleep(0.05)    # running: now hang up
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert wait_settled(tight.url) == SETTLED
    assert httpx.get(tight.url + "/v1/serve").json()["abandoned"] - abandoned0 == 4


def test_online_requests_overtake_a_bulk_job(served):
    """A bulk job (POST /v1/generate at priority 0, what `forge deploy` sends) fills the node's
    queue; online completions (priority 10) arriving later finish while the bulk job still has
    queued work."""
    async def main():
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
            bulk_items = [
                {"prompt": f"Record {i}: the Queen said", "max_tokens": 48} for i in range(256)
            ]
            bulk = asyncio.ensure_future(http.post("/v1/generate", json={"requests": bulk_items}))
            while (await http.get("/v1/stats")).json()["broker"]["pending"] < 100:
                await asyncio.sleep(0.02)
            t0 = time.monotonic()

            async def online(i):
                r = await http.post("/v1/completions", json=completion(8, prompt=f"Online {i}: "
                                                                                 "Alice"))
                return r, time.monotonic() - t0

            answers = await asyncio.gather(*(online(i) for i in range(8)))
            pending_when_online_done = (await http.get("/v1/stats")).json()["broker"]["pending"]
            bulk_done_early = bulk.done()
            r = await bulk
            return answers, pending_when_online_done, bulk_done_early, r, time.monotonic() - t0

    answers, pending, bulk_done_early, bulk, bulk_s = asyncio.run(main())
    assert all(r.status_code == 200 for r, _ in answers)
    online_max = max(dt for _, dt in answers)
    assert not bulk_done_early and pending > 0, (pending, online_max, bulk_s)
    assert online_max < bulk_s / 2, (online_max, bulk_s)
    assert bulk.status_code == 200 and all("text" in x for x in bulk.json()["results"])
    assert wait_settled(served.url) == SETTLED
