"""HostQueue, behaviour by behaviour (forge/host/queue.py's docstring lists them), and against the
one-engine, grouping-off BrokerCore it replaced: the same operations give the same batches, refusals
and drains."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.broker import BrokerCore, BrokerRequest, EngineGeometry, NoEngineFits, QueueFull
from forge.engines.interface import RequestKey
from forge.host.queue import HostQueue
from forge.host.request import HostRequest


def geom(*, slots: int = 8, budget: int = 100, max_in: int = 384, max_out: int = 64, tpb: int = 16,
         kv: int = 4096) -> EngineGeometry:
    return EngineGeometry(
        engine_id="cpu0",
        tokenizer_key="t",
        max_batch_size=slots,
        max_num_tokens=budget,
        max_input_len=max_in,
        max_output_len=max_out,
        tokens_per_block=tpb,
        kv_blocks_total=kv,
    )


def hr(i: int, n: int = 10, max_new: int = 6, priority: int = 0, attempt: int = 0) -> HostRequest:
    return HostRequest(RequestKey("s", f"r{i}", attempt), tuple(range(n)), max_new, priority)


def rids(batch) -> list[str]:
    return [r.key.rid for r in batch]


def filled(q: HostQueue, reqs) -> HostQueue:
    for r in reqs:
        q.add(r)
    return q


def test_priority_first_then_arrival_order_in_takes_and_in_drain():
    reqs = [hr(0), hr(1, priority=2), hr(2), hr(3, priority=2), hr(4, priority=1)]
    q = filled(HostQueue(geom(), node="n", max_pending=10), reqs)
    assert rids(q.take_now(8, 4096)) == ["r1", "r3"]  # one priority per take, the highest first
    assert rids(q.take_now(8, 4096)) == ["r4"]
    assert rids(q.take_now(8, 4096)) == ["r0", "r2"]
    q2 = filled(
        HostQueue(geom(), node="n", max_pending=10),
        [hr(i + 10, priority=r.priority) for i, r in enumerate(reqs)],
    )
    assert rids(q2.drain()) == ["r11", "r13", "r14", "r10", "r12"]
    assert q2.pending() == 0 and q2.take_now(8, 4096) == []


def test_a_take_keeps_its_prompts_within_the_token_budget():
    q = filled(
        HostQueue(geom(budget=100), node="n", max_pending=10), [hr(i, n=30) for i in range(6)]
    )
    assert rids(q.take_now(8, 4096)) == ["r0", "r1", "r2"]  # 90 tokens; a fourth would make 120
    assert rids(q.take_now(8, 4096)) == ["r3", "r4", "r5"]


def test_a_prompt_longer_than_the_budget_goes_alone_and_only_first():
    q = filled(
        HostQueue(geom(budget=50), node="n", max_pending=10),
        [hr(0, n=10), hr(1, n=80), hr(2, n=10)],
    )
    assert rids(q.take_now(8, 4096)) == ["r0"]  # r1 does not join a batch over budget
    assert rids(q.take_now(8, 4096)) == ["r1"]  # first in its take: alone
    assert rids(q.take_now(8, 4096)) == ["r2"]


def test_free_slots_and_free_kv_blocks_bound_a_take():
    q = filled(
        HostQueue(geom(tpb=16), node="n", max_pending=10),
        [hr(i, n=20, max_new=12) for i in range(6)],
    )
    assert rids(q.take_now(2, 4096)) == ["r0", "r1"]  # two slots
    assert rids(q.take_now(8, 5)) == ["r2", "r3"]     # 2 blocks each (32 tokens of 16): 5 hold 2
    assert q.take_now(8, 1) == [] and q.take_now(0, 4096) == [] and q.take_now(8, 0) == []
    assert q.pending() == 2


def test_nothing_overtakes_a_request_that_does_not_fit_not_even_a_lower_priority():
    q = filled(
        HostQueue(geom(tpb=16), node="n", max_pending=10),
        [
            hr(0, n=100, max_new=28, priority=1),
            hr(1, n=4, max_new=4, priority=1),
            hr(2, n=4, max_new=4),
        ],
    )
    assert q.take_now(8, 7) == []             # r0 needs 8 blocks; r1 behind it and r2 below it wait
    # 8 blocks, 1 left: r1 needs 1 but its 4 tokens stay in the budget
    assert rids(q.take_now(8, 9)) == ["r0"]
    assert rids(q.take_now(8, 9)) == ["r1"]


def test_max_pending_counts_what_waits_not_what_was_taken():
    q = filled(HostQueue(geom(), node="n", max_pending=3), [hr(i) for i in range(3)])
    with pytest.raises(QueueFull, match="max_pending"):
        q.add(hr(3))
    assert len(q.take_now(2, 4096)) == 2 and q.in_flight() == 2
    q.add(hr(3))
    q.add(hr(4))
    assert q.pending() == 3


@pytest.mark.parametrize("n, max_new, why", [
    (400, 4, "prompt 400 tokens > max_input_len 384"),
    (10, 65, "max_new_tokens 65 > max_output_len 64"),
    (300, 60, "needs 23 KV blocks of 16 > the pool's 20"),
])
def test_a_request_the_engine_cannot_hold_is_refused_in_words(n, max_new, why):
    q = HostQueue(geom(kv=20), node="n", max_pending=3)
    with pytest.raises(NoEngineFits) as e:
        q.add(hr(0, n=n, max_new=max_new))
    assert str(e.value).startswith(f"{why}: it does not fit engine cpu0 on node n (limits: cpu0 "
                                   "(max_input_len 384")
    assert "request s|r0|0" in str(e.value) and q.pending() == 0


def test_a_key_is_refused_while_queued_or_taken_and_free_once_done_or_drained():
    q = HostQueue(geom(), node="n", max_pending=5)
    first = hr(0)
    q.add(first)
    with pytest.raises(ValueError, match="already queued or in flight"):
        q.add(hr(0))
    q.add(hr(0, attempt=1))                                   # the next attempt is another key
    [taken, _] = q.take_now(8, 4096)
    assert taken is first and q.queued(first.key) is None
    with pytest.raises(ValueError):
        q.add(hr(0))
    q.done(taken)
    q.done(taken)                                             # a repeated done is a no-op
    q.add(hr(0))
    assert q.queued(RequestKey("s", "r0", 0)) is not None and q.in_flight() == 1
    q.drain()
    q.add(hr(0))                                              # drained keys are forgotten


def test_an_unhealthy_engine_takes_nothing_until_it_is_healthy_again():
    q = filled(HostQueue(geom(), node="n", max_pending=5), [hr(0)])
    q.set_healthy(False)
    assert q.take_now(8, 4096) == [] and q.pending() == 1
    q.set_healthy(True)
    assert rids(q.take_now(8, 4096)) == ["r0"]


def test_take_waits_for_an_arrival_or_for_health_and_times_out_empty():
    async def go():
        q = HostQueue(geom(), node="n", max_pending=5)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await q.take(free_slots=8, free_kv_blocks=4096, timeout_s=0.05) == []
        assert loop.time() - t0 >= 0.05
        loop.call_later(0.02, q.add, hr(0))
        t0 = loop.time()
        assert rids(await q.take(free_slots=8, free_kv_blocks=4096, timeout_s=5)) == ["r0"]
        assert loop.time() - t0 < 1.0
        q.set_healthy(False)
        q.add(hr(1))
        loop.call_later(0.02, q.set_healthy, True)
        assert rids(await q.take(free_slots=8, free_kv_blocks=4096, timeout_s=5)) == ["r1"]
        q.add(hr(2, n=10, max_new=30))  # 3 blocks: a take of 2 free blocks waits it out
        assert await q.take(free_slots=8, free_kv_blocks=2, timeout_s=0.03) == []
        assert not q._takers  # bounded: a timed-out wait leaves nothing behind

    asyncio.run(go())


# ----------------------------------------------------------------------------- the one-engine
# BrokerCore it replaced
ADD = st.tuples(
    st.just("add"), st.integers(0, 12), st.integers(0, 52), st.integers(0, 24), st.integers(0, 2)
)
OPS = st.lists(st.one_of(
    ADD, ADD, ADD,  # arrivals weigh most: takes then meet several priorities and budgets to respect
    st.tuples(st.just("take"), st.integers(0, 5), st.integers(0, 26)),
    st.tuples(st.just("take"), st.just(4), st.just(24)),
    st.tuples(st.just("done"), st.integers(0, 12)),
    st.tuples(st.just("health"), st.sampled_from([True, True, False])),
    st.tuples(st.just("drain"),)), min_size=20, max_size=80)


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_every_operation_answers_as_the_one_engine_broker_core_did(ops):
    g = geom(slots=4, budget=40, max_in=48, max_out=20, tpb=8, kv=24)
    core = BrokerCore([g], grouping=False, max_pending=8, node="n")
    q = HostQueue(g, node="n", max_pending=8)
    taken_core: dict[str, BrokerRequest] = {}
    taken_host: dict[str, HostRequest] = {}

    def outcome(fn):
        try:
            return fn()
        except (QueueFull, NoEngineFits, ValueError) as e:
            return type(e)

    for op in ops:
        if op[0] == "add":
            _, i, n, max_new, prio = op
            prompt = tuple(range(n))
            a = outcome(
                lambda: core.add(BrokerRequest(f"r{i}", {"t": prompt}, max_new, priority=prio))
            )
            b = outcome(
                lambda: q.add(HostRequest(RequestKey("s", f"r{i}", 0), prompt, max_new, prio))
            )
            assert a == b, op
        elif op[0] == "take":
            a = core.take("cpu0", free_slots=op[1], free_kv_blocks=op[2])
            b = q.take_now(op[1], op[2])
            assert [r.request_id for r in a] == rids(b), op
            taken_core.update((r.request_id, r) for r in a)
            taken_host.update((r.key.rid, r) for r in b)
        elif op[0] == "done":
            rid = f"r{op[1]}"
            if rid in taken_core:
                core.on_done("cpu0", taken_core.pop(rid))
                q.done(taken_host.pop(rid))
        elif op[0] == "health":
            core.set_engine_healthy("cpu0", op[1])
            q.set_healthy(op[1])
        else:
            assert [r.request_id for r in core.drain()] == rids(q.drain())
        assert core.pending() == q.pending() and core.in_flight() == q.in_flight()
