"""Admission around the real vLLM engine keeps a queue inside it: up to max_batch_size requests
beyond its slots, each with its KV reserved, so a slot that frees is refilled by vLLM's scheduler in
the same step, and vLLM still never preempts (docs/admission.md, "An engine's own queue")."""
from __future__ import annotations

import asyncio
import time

import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.engines.interface import RequestKey
from forge.host.admission import CardAdmission, geometry_from_plan
from forge.host.link_sessions import LinkSessions
from forge.host.request import HostRequest

pytestmark = pytest.mark.timeout(300)


def test_admission_holds_a_queue_in_vllm_and_vllm_never_preempts():
    from forge.backends import factory

    plan = load_node(PACKAGED_NODES["local-vllm"]).plans[0]
    engine = factory("vllm", card="cpu0")(plan.contract, plan)
    slots = plan.contract.limits.max_batch_size
    n = 3 * slots
    prompt = tuple(engine.tokenizer.encode("Alice was beginning to get very tired of sitting by "
                                           "her sister"))

    async def go():
        g = geometry_from_plan(plan, "default", engine)
        assert g.queue_slots == slots and g.held == 2 * slots
        feed = LinkSessions(g, node="t", max_pending=4 * slots)
        feed.session("s")
        got: dict[str, list] = {}
        rt = CardAdmission(engine=engine, plan=plan, source=feed, node="t",
                              deliver=lambda req, res: got.setdefault(req.key.rid, []).append(res))
        task = asyncio.create_task(rt.run())
        assert (
            feed.put("s", [HostRequest(RequestKey("s", f"r{i}", 0), prompt, 24) for i in range(n)])
            == n
        )
        peak_held = peak_queued = 0
        deadline = time.monotonic() + 240
        while len(got) < n:
            assert time.monotonic() < deadline, f"{n - len(got)} request(s) undelivered"
            s = rt.stats()
            peak_held, peak_queued = max(peak_held, s.in_flight), max(peak_queued, s.engine_queued)
            await asyncio.sleep(0.005)
        s = rt.stats()
        await rt.stop()
        await asyncio.wait_for(task, 60)
        return peak_held, peak_queued, s

    peak_held, peak_queued, s = asyncio.run(go())
    assert peak_held == 2 * slots  # the slots and as many again waiting in vLLM's own queue
    assert peak_queued > 0         # vLLM reported requests waiting (its stats, sampled every 0.1 s)
    assert s.requests_ok == n and s.preemptions == 0
