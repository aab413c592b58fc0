"""The admission runtime around the real tiny model (transformers backend), with and without
injected faults."""
from __future__ import annotations

import asyncio

import pytest

from tests.installed import skip_module_unless_installed

skip_module_unless_installed("torch", "transformers")

from tests.host._admission_harness import Harness, LinkedCards, contract, plan  # noqa: E402
from forge.engines.interface import Sampling  # noqa: E402
from forge.backends import factories  # noqa: E402
from forge.requests import RequestOptions  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(90)]

# every result has exactly max_new tokens
FULL_LENGTH = RequestOptions(sampling=Sampling(stop_at_eos=False))


def build(c, p):
    return factories()[c.backend](c, p)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_tiny_engine_delivers_everything_within_slots_and_kv_blocks():
    # 8 slots; the pool (256 tokens = 8 blocks) holds only 4 requests of 20 + 40 tokens.
    c = contract(backend="transformers", slots=8, kv_tokens=256)
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(build(c, p), p, stall_window_s=10.0)
        sampler = asyncio.create_task(h.sample())
        ids = h.put(24, prompt_len=20, max_new=40, payload=FULL_LENGTH)
        await h.wait_all(ids, 45)
        sampler.cancel()
        h.assert_exactly_once(ids)
        s = rt.stats()
        assert all(
            r.finish_reason == "length" and len(r.output_ids) == 40
            for [(_, r)] in h.results.values()
        )
        assert h.max_in_flight["cpu0"] == 4 and h.max_reserved["cpu0"] == 8
        assert s.admission_refusals == 0 and s.requests_ok == 24 and s.output_tokens == 24 * 40
        assert s.engine_steps > 0 and s.kv_blocks_used <= s.kv_blocks_total and s.tokens_per_s > 0
        await h.stop()

    run(go())


def test_tiny_engine_frozen_then_recovered_loses_nothing():
    c = contract(backend="faults", slots=4, sections={
        "faults": {"wraps": "transformers", "freeze_after_requests": 2, "freeze_for_s": 1.0}})
    p = plan(c)

    async def go():
        h = Harness(p)
        rt = h.start(build(c, p), p, stall_window_s=0.25, takeback_interval_s=0.05)
        ids = h.put(10, prompt_len=20, max_new=24, payload=FULL_LENGTH)
        await h.wait_all(ids, 45)
        h.assert_exactly_once(ids)
        s = rt.stats()
        assert all(
            r.finish_reason == "length" and len(r.output_ids) == 24
            for [(_, r)] in h.results.values()
        )
        assert (
            s.stalls >= 1 and s.progress_only_steps >= 1 and s.requests_requeued >= 1 and s.healthy
        )
        await h.stop()

    run(go())


def test_tiny_engine_crash_moves_its_work_to_another_card():
    a = contract(name="a", backend="faults", slots=4, sections={
        "faults": {"wraps": "transformers", "crash_after_requests": 3}})
    b = contract(name="b", slots=4, sections={"instant": {"tokens_per_s_limit": 2000.0}})
    pa, pb = plan(a, 0), plan(b, 1)

    async def go():
        # the node's broker and links between the two cards
        h = LinkedCards([pa, pb], stall_window_s=10.0)
        await h.start()
        ra = h.runtime(0)
        ids = h.put(16, prompt_len=20, max_new=24, payload=FULL_LENGTH)
        await h.wait_all(ids, 45)
        h.assert_exactly_once(ids)
        assert h.by_card().count("cpu0") == 3
        assert all(r[2] == "length" for [(_, r)] in h.results.values())
        await asyncio.wait_for(h.admission_task(0), 10)
        assert ra.state == "failed" and not ra.stats().healthy and "injected crash" in ra.failure
        assert ra.stats().requests_requeued >= 1             # it had work in flight when it died
        await h.stop()

    run(go())
