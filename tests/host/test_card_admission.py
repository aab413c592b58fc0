"""The admission runtime against the instant engine and the faults wrapper (real engines, no model),
taking from an engine host's LinkSessions fed as a link feeds it (_admission_harness.py)."""
from __future__ import annotations

import asyncio

import pytest

from tests.host._admission_harness import (
    Harness,
    LinkedCards,
    contract,
    faulty,
    instant,
    plan,
    prompt,
)
from forge import constants
from forge.requests import RequestOptions
from forge_bench.engines.instant import synthetic_output

pytestmark = pytest.mark.timeout(30)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_all_delivered_exactly_once_within_slots_and_kv_blocks():
    # 8 slots, but the KV pool (256 tokens = 8 blocks of 32) holds only 4 requests of 20 + 40
    # tokens.
    c = contract(slots=8, kv_tokens=256)
    p = plan(c)

    async def go():
        h = Harness(p)
        eng = instant(c, p, rate=40000)
        rt = h.start(eng, p, stall_window_s=2.0)
        sampler = asyncio.create_task(h.sample())
        ids = h.put(120, prompt_len=20, max_new=40)
        await h.wait_all(ids, 15)
        sampler.cancel()
        h.assert_exactly_once(ids)
        s = rt.stats()
        # KV was the binding bound
        assert h.max_reserved["cpu0"] == 8 and h.max_in_flight["cpu0"] == 4
        assert s.admission_refusals == 0  # the engine (which refuses overflow) never saw too much
        assert s.requests_ok == 120 and s.input_tokens == 120 * 20 and s.output_tokens == 120 * 40
        assert s.in_flight == 0 and s.kv_blocks_reserved == 0 and s.tokens_per_s > 0
        for rid, [(card, res)] in h.results.items():
            assert res.finish_reason == "length"
            assert res.output_ids == synthetic_output(h.requests[rid].prompt, 40, 3, 2048)
        await h.stop()
        assert rt.state == "stopped"

    run(go())


def test_slots_bind_when_kv_is_plenty():
    c = contract(slots=3, kv_tokens=16384)
    p = plan(c)

    async def go():
        h = Harness(p)
        h.start(instant(c, p, rate=20000), p, stall_window_s=2.0)
        sampler = asyncio.create_task(h.sample())
        ids = h.put(60)
        await h.wait_all(ids, 15)
        sampler.cancel()
        h.assert_exactly_once(ids)
        assert h.max_in_flight["cpu0"] == 3
        await h.stop()

    run(go())


def test_refusals_are_retried_with_backoff_then_succeed():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, refuse_first_submits=3), p, stall_window_s=2.0)
        ids = h.put(10)
        await h.wait_all(ids, 10)
        h.assert_exactly_once(ids)
        s = rt.stats()
        assert s.admission_refusals == 3 and s.retries == 3 and s.requests_requeued == 0
        assert all(r.finish_reason == "length" for [(_, r)] in h.results.values())
        await h.stop()

    run(go())


def test_refusals_beyond_the_retry_limit_go_back_to_the_link(monkeypatch):
    monkeypatch.setattr(constants, "SUBMIT_BACKOFF_MAX_S", 0.01)
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(
            faulty(c, p, refuse_first_submits=constants.SUBMIT_RETRY_LIMIT + 1),
            p,
            stall_window_s=2.0,
        )
        ids = h.put(4)
        await h.wait_all(ids, 10)
        h.assert_exactly_once(ids)
        s = rt.stats()
        assert (
            s.requests_requeued == 4
            and s.retries == constants.SUBMIT_RETRY_LIMIT
            and s.requests_ok == 4
        )
        await h.stop()

    run(go())


def test_a_request_that_keeps_coming_back_fails_with_a_reason(monkeypatch):
    monkeypatch.setattr(constants, "SUBMIT_RETRY_LIMIT", 1)
    monkeypatch.setattr(constants, "SUBMIT_BACKOFF_BASE_S", 0.001)
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, refuse_first_submits=1000), p, stall_window_s=2.0)
        ids = h.put(1)
        await h.wait_all(ids, 10)
        [(card, res)] = h.results["r0"]
        assert res.finish_reason == "error"
        assert (
            "refused" in res.error
            and f"{constants.REQUEST_ATTEMPT_LIMIT + 1} attempts" in res.error
        )
        assert (
            rt.stats().requests_failed == 1
            and rt.stats().requests_requeued == constants.REQUEST_ATTEMPT_LIMIT
        )
        await h.stop()

    run(go())


def test_deadline_cancels_in_the_engine_and_fails_the_request():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(instant(c, p, rate=200), p, stall_window_s=2.0)   # 148 tokens take ~0.7 s
        ids = h.put(1, max_new=128, payload=RequestOptions(deadline_s=0.2))
        ids += h.put(1, max_new=2, start=1)
        await h.wait_all(ids, 10)
        h.assert_exactly_once(ids)
        [(_, late)] = h.results["r0"]
        assert late.finish_reason == "error" and "deadline exceeded" in late.error
        assert h.results["r1"][0][1].finish_reason == "length"
        await asyncio.sleep(0.2)
        assert rt.stats().in_flight == 0         # the engine gave the cancelled request back
        await h.stop()

    run(go())


def test_options_reach_the_engine():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        h.start(instant(c, p), p, stall_window_s=2.0)
        ids = h.put(1, payload=RequestOptions(want_hidden=True))
        await h.wait_all(ids, 5)
        assert len(h.results["r0"][0][1].hidden) == 16
        await h.stop()

    run(go())


def test_the_brokers_priority_reaches_the_engine():
    """An engine that orders its own waiting queue (vLLM) is given each request's priority."""
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        eng, seen = instant(c, p), []
        submit = eng.submit
        eng.submit = lambda reqs: (
            seen.extend((r.request_id.rid, r.priority) for r in reqs),
            submit(reqs),
        )[1]
        h.start(eng, p, stall_window_s=2.0)
        h.backlog.extend(
            [("online", 0, prompt(0), 4, 10, None, 0.0), ("bulk", 0, prompt(1), 4, 0, None, 0.0)]
        )
        h._send()
        await h.wait_all(["online", "bulk"], 5)
        assert sorted(seen) == [("bulk", 0), ("online", 10)]
        await h.stop()

    run(go())


def test_drain_waits_for_in_flight_then_run_returns():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(instant(c, p, rate=2000), p, stall_window_s=2.0)
        ids = h.put(8, max_new=32)
        await asyncio.sleep(0.05)
        assert await rt.drain(10) is True
        await asyncio.wait_for(h.tasks[0], 5)
        assert rt.state == "stopped" and not rt._driver.alive()
        # what the runtime took was finished; what it had not taken is still queued in the host
        assert len(h.results) + h.pending() == len(ids) and len(h.results) >= 4
        assert h.feed.queue.pending() == len(ids) - len(h.results)
        assert all(len(v) == 1 and v[0][1].finish_reason == "length" for v in h.results.values())

    run(go())


def test_stop_gives_in_flight_back_to_the_link_and_shuts_the_engine_down():
    c = contract(slots=4)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(faulty(c, p, freeze_after_requests=0), p, stall_window_s=5.0)
        h.put(6)
        await asyncio.sleep(0.2)
        assert rt.stats().in_flight == 4
        await h.stop()
        assert h.results == {}
        assert h.pending() == 6  # 4 given back to the link, 2 still queued in the host
        assert rt.stats().requests_requeued == 4 and rt.state == "stopped"

    run(go())


def test_two_engines_of_known_speed_share_work_by_what_they_deliver():
    # each host measures what its engine delivers; its link carries that to the node's broker, which
    # balances by it
    a = contract(name="a", slots=4, sections={"instant": {"tokens_per_s_limit": 2000.0}})
    b = contract(name="b", slots=4, sections={"instant": {"tokens_per_s_limit": 8000.0}})
    pa, pb = plan(a, 0), plan(b, 1)

    async def go():
        h = LinkedCards([pa, pb], stall_window_s=2.0)
        await h.start()
        ra, rb = h.runtime(0), h.runtime(1)
        ids = h.put(200, prompt_len=20, max_new=20)  # 8000 tokens: ~0.8 s at 10000 tokens/s
        await h.wait_all(ids, 15)
        h.assert_exactly_once(ids)
        sa, sb = ra.stats(), rb.stats()
        done_a, done_b = sa.input_tokens + sa.output_tokens, sb.input_tokens + sb.output_tokens
        assert done_b > 2.5 * done_a, (done_a, done_b)
        assert 700 < sa.tokens_per_s < 3000 and 2800 < sb.tokens_per_s < 12000, (
            sa.tokens_per_s,
            sb.tokens_per_s,
        )
        await h.stop()

    run(go())


def test_stop_before_run_shuts_the_engine_down():
    c = contract(slots=4)
    p = plan(c)
    eng = instant(c, p)

    async def go():
        h = Harness(p)
        from forge.host.admission import CardAdmission
        rt = CardAdmission(engine=eng, plan=p, source=h.feed, node="test", deliver=h._deliver)
        assert rt.state == "idle" and rt.geometry.kv_blocks_total == p.num_blocks
        await rt.stop()
        assert rt.state == "stopped"

    run(go())
    from forge.engines.interface import EngineFailed
    with pytest.raises(EngineFailed):
        eng.submit([])
