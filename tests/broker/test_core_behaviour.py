"""BrokerCore behaviour, example by example: budgets, order, priority, requeue and refusals.
Grouping, prefix accounting and affinity are in test_core_affinity.py; property tests over random
operation sequences in test_core_properties.py."""
from __future__ import annotations

import pytest

from forge.broker import BrokerCore, NoEngineFits, QueueFull
from forge.broker.types import blocks_needed

from .helpers import drain, geom, prefixed, req


def test_batch_respects_slots_kv_and_token_budget():
    core = BrokerCore([geom(slots=4, budget=100, tpb=16)], grouping=False)
    rs = [req(range(30), max_new=10) for _ in range(10)]          # 30 prompt tokens, 3 blocks each
    for r in rs:
        core.add(r)
    assert len(core.take("e0", free_slots=10, free_kv_blocks=100)) == 3  # budget: 3 x 30 <= 100
    assert len(core.take("e0", free_slots=2, free_kv_blocks=100)) == 2   # slots
    assert len(core.take("e0", free_slots=10, free_kv_blocks=7)) == 2    # KV: 2 x 3 blocks <= 7
    assert core.take("e0", free_slots=0, free_kv_blocks=100) == []
    assert core.take("e0", free_slots=4, free_kv_blocks=2) == []
    assert blocks_needed(rs[0], core.engines[0]) == 3


def test_a_prompt_longer_than_the_token_budget_goes_alone():
    core = BrokerCore([geom(budget=64, max_in=200)], grouping=True)
    core.add(req(range(150)))
    core.add(req(range(10)))
    first = core.take("e0", free_slots=8, free_kv_blocks=1000)
    assert [len(r.prompts["t"]) for r in first] == [150]
    assert len(core.take("e0", free_slots=8, free_kv_blocks=1000)) == 1


@pytest.mark.parametrize("grouping", [False, True])
def test_priority_first(grouping):
    core = BrokerCore([geom()], grouping=grouping)
    low = [req(range(20), priority=0) for _ in range(3)]
    high = [req(range(20), priority=5) for _ in range(2)]
    for r in low[:2] + high + low[2:]:
        core.add(r)
    assert core.take("e0", free_slots=8, free_kv_blocks=4096) == high
    assert core.take("e0", free_slots=8, free_kv_blocks=4096) == low


def test_fifo_mode_keeps_arrival_order_and_stops_at_the_first_misfit():
    core = BrokerCore([geom(budget=100)], grouping=False)
    rs = [req(range(n)) for n in (10, 90, 5, 5)]
    for r in rs:
        core.add(r)
    # 10 + 90 = 100: budget full
    assert core.take("e0", free_slots=8, free_kv_blocks=4096) == rs[:2]
    assert core.take("e0", free_slots=8, free_kv_blocks=4096) == rs[2:]


def test_grouped_mode_takes_the_longest_requested_output_first_in_a_bucket():
    # one prefix group, one length bucket: the most new tokens first, arrival order among equals; a
    # batch job's tail is then its short requests (forge/broker/pending.py: output classes are
    # levels)
    core = BrokerCore([geom(budget=1000)], grouping=True)
    rs = [req(prefixed(0, 40, k), max_new=m) for k, m in enumerate((16, 128, 48, 128, 16, 96))]
    for r in rs:
        core.add(r)
    got = drain(core, slots=2)
    assert [r.max_new_tokens for b in got for r in b] == [128, 128, 96, 48, 16, 16]
    assert [r.request_id for b in got for r in b][:2] == [rs[1].request_id, rs[3].request_id]
    # FIFO mode keeps arrival order: the baseline the bench compares against
    fifo = BrokerCore([geom(budget=1000)], grouping=False)
    for r in rs:
        fifo.add(req(r.prompts["t"], max_new=r.max_new_tokens, rid=r.request_id + "f"))
    assert [r.max_new_tokens for b in drain(fifo, slots=2) for r in b] == [16, 128, 48, 128, 16, 96]


def test_longest_first_holds_across_prefix_groups_and_buckets_below_priority():
    # the long outputs of every group go before any group's short ones (output class is a level
    # under the priority: forge/broker/pending.py); a batch fills down the classes; priority still
    # comes first (a batch keeps to one prompt-length bucket, the first class's: here all prompts
    # are 40 tokens)
    core = BrokerCore([geom(budget=4000)], grouping=True)
    short = [req(prefixed(k, 40, k), max_new=16) for k in range(4)]              # 4 prefix groups
    long_ = [req(prefixed(k, 40, 10 + k), max_new=100) for k in range(4)]
    urgent = req(prefixed(9, 40, 99), max_new=8, priority=1)
    for r in short + long_ + [urgent]:
        core.add(r)
    first = core.take("e0", free_slots=1, free_kv_blocks=4096)
    assert first == [urgent]                                        # priority before output length
    got = core.take("e0", free_slots=6, free_kv_blocks=4096)
    # every group's long one, then short ones
    assert sorted(r.max_new_tokens for r in got[:4]) == [100] * 4
    assert [r.max_new_tokens for r in got[4:]] == [16, 16]


def test_an_engine_that_wants_no_output_classes_gets_prefix_groups_together_whatever_their_lengths():
    # vLLM's steps mix prefill with decode unpadded (Engine.output_classes_first False): longest
    # first across groups would scatter each group's requests in time, so a group's blocks are
    # evicted between them
    from dataclasses import replace

    rs = [
        req(prefixed(k, 40, 10 * k + j), max_new=m)
        for k in range(4)
        for j, m in enumerate((100, 16))
    ]
    taken = {}
    for first in (True, False):
        core = BrokerCore([replace(geom(budget=4000), output_classes_first=first)], grouping=True)
        for r in rs:
            core.add(req(r.prompts["t"], max_new=r.max_new_tokens, rid=f"{r.request_id}-{first}"))
        taken[first] = [r for b in drain(core, slots=2) for r in b]
    assert [r.max_new_tokens for r in taken[True]] == [100] * 4 + [16] * 4
    families = [r.prompts["t"][:64] for r in taken[False]]
    # a group's two requests together
    assert all(families[i] == families[i + 1] for i in range(0, 8, 2))
    assert len(set(families)) == 4


def test_one_engine_orders_by_fine_classes_several_by_the_power_of_two_alone():
    # outputs 16-31 are one power of two: with one engine every length below 64 is its own class
    # (the last taken are the shortest, so the tail is as short as the work allows), above it 32
    # classes to a power of two; with several, finer classes would pull engines across more prefix
    # families, so the class stays the whole power and arrival order holds inside it
    lengths = (16, 31, 20, 27, 19, 24)
    one = BrokerCore([geom(budget=1000)], grouping=True)
    for k, m in enumerate(lengths):
        one.add(req(prefixed(0, 40, k), max_new=m))
    assert [r.max_new_tokens for b in drain(one, slots=2) for r in b] == [31, 27, 24, 20, 19, 16]
    wide = BrokerCore([geom(budget=1000, max_out=2048)], grouping=True)
    for k, m in enumerate((1000, 1030, 1024, 1100)):  # 1024-1055 is one class of 32 in 1024-2047
        wide.add(req(prefixed(0, 40, k), max_new=m))
    assert [r.max_new_tokens for b in drain(wide, slots=1) for r in b] == [1100, 1030, 1024, 1000]
    two = BrokerCore([geom("a", budget=1000), geom("b", budget=1000)], grouping=True)
    for k, m in enumerate(lengths):
        two.add(req(prefixed(0, 40, k), max_new=m))
    assert [r.max_new_tokens for b in drain(two, "a", slots=2) for r in b] == list(lengths)


def test_one_engine_admits_no_shorter_request_ahead_of_a_longer_one_that_did_not_fit_the_take():
    # KV for two long requests and one short one: a broker of one engine stops at the long class,
    # which still has work, so its requests start (and end) together and the short one waits for the
    # next take; with several engines the take fills down the classes as before. Measured on the CPU
    # tier of the 8B fast tier's geometry: forge 134 -> 133 engine steps, transformers' own API 133
    # (docs/broker.md, "Output classes")
    def batch(engines):
        core = BrokerCore(engines, grouping=True)
        for k in range(3):
            core.add(req(prefixed(k, 40, k), max_new=100))           # 140 tokens: 9 blocks of 16
        core.add(req(prefixed(5, 40, 9), max_new=16))                # 56 tokens: 4 blocks
        return [r.max_new_tokens for r in core.take("a", free_slots=8, free_kv_blocks=22)]

    assert batch([geom("a")]) == [100, 100]
    assert batch([geom("a"), geom("b")]) == [100, 100, 16]


@pytest.mark.parametrize("bits", [0, 2, 5])
def test_output_classes_never_put_a_shorter_request_above_a_longer_one(bits):
    from types import SimpleNamespace
    from forge.broker.pending import MAX_CLASS_BITS, REQUEUED, output_class

    classes = [
        output_class(SimpleNamespace(priority=0, max_new_tokens=n), bits) for n in range(1, 5000)
    ]
    assert classes == sorted(classes) and max(classes) < REQUEUED
    # 16-31 split into 2**bits classes (16 at most)
    assert len(set(classes[15:31])) == min(1 << bits, 16)
    assert len(set(classes[1023:2047])) == 1 << bits  # 1024-2047 likewise
    whole = [
        output_class(SimpleNamespace(priority=0, max_new_tokens=n), 0) >> MAX_CLASS_BITS
        for n in range(1, 5000)
    ]
    assert whole == [n.bit_length() for n in range(1, 5000)]  # bits 0: the power of two, as before
    with pytest.raises(ValueError, match="class_bits"):
        from forge.broker.pending import Pending
        Pending(1, 1, None, None, class_bits=MAX_CLASS_BITS + 1)


def test_a_spill_moves_a_family_when_its_owner_holds_another_in_any_class():
    # a owns families 0 and 1, each with long and short requests; past its bound, b spills: it takes
    # a whole family over (every class: one owner), because a has another family — even if not in
    # the class being spilled
    core = BrokerCore([geom("a", slots=4), geom("b", slots=4)], grouping=True)
    for f in (0, 1):
        seed = req(prefixed(f, 70, 900 + f))
        core.add(seed)
        assert core.take("a", free_slots=1, free_kv_blocks=4096) == [seed]
    n = 0
    for f, lengths in ((0, (100, 100, 100, 8, 8, 8)), (1, (8, 8, 8, 8, 8, 8))):
        for m in lengths:
            core.add(req(prefixed(f, 70, n), max_new=m))
            n += 1
    got = core.take("b", free_slots=2, free_kv_blocks=4096)
    assert [r.max_new_tokens for r in got] == [100, 100] and core.stats().affinity_spills == 2
    groups = [
        g
        for part in core._pending.parts.values()
        for lvl in part.levels.values()
        for g in lvl.groups.values()
    ]
    fam0 = [
        g
        for g in groups
        if any(e.req.prompts["t"][0] == 1000 for q in g.buckets.values() for e in q)
    ]
    assert len(fam0) == 2 and {g.owner for g in fam0} == {1}  # family 0, both classes, now b's
    assert core.loads()["a"]["pinned_pending_requests"] == 6  # family 1 stays a's


def test_online_priorities_keep_arrival_order_across_output_lengths():
    # longest first is for a bulk job's makespan; online work (priority above 0) is latency work
    core = BrokerCore([geom()], grouping=True)
    online = [
        req(prefixed(k, 40, k), max_new=m, priority=10) for k, m in enumerate((8, 120, 16, 120))
    ]
    bulk = [req(prefixed(k, 40, 10 + k), max_new=m) for k, m in enumerate((8, 120))]
    for r in online + bulk:
        core.add(r)
    assert core.take("e0", free_slots=4, free_kv_blocks=4096) == online
    assert core.take("e0", free_slots=4, free_kv_blocks=4096) == bulk[::-1]


def test_requeued_work_goes_before_every_output_class_of_its_priority():
    core = BrokerCore([geom()], grouping=True)
    rs = [req(prefixed(0, 40, k), max_new=m) for k, m in enumerate((8, 8, 120, 120))]
    for r in rs:
        core.add(r)
    got = core.take("e0", free_slots=2, free_kv_blocks=4096)
    assert [r.max_new_tokens for r in got] == [120, 120]
    short = core.take("e0", free_slots=1, free_kv_blocks=4096)
    core.requeue(got + short)                                      # e.g. its worker died
    again = core.take("e0", free_slots=8, free_kv_blocks=4096)
    assert again[:3] == got + short and again[3:] == [rs[1]]


def test_a_long_class_pinned_elsewhere_is_not_spilled_while_the_engine_has_its_own_work():
    core = BrokerCore([geom("a"), geom("b")], grouping=True)
    seed_a, seed_b = req(prefixed(0, 40, 0)), req(prefixed(1, 40, 1))
    core.add(seed_a)
    assert core.take("a", free_slots=1, free_kv_blocks=4096) == [seed_a]      # family 0 pinned to a
    core.add(seed_b)
    assert core.take("b", free_slots=1, free_kv_blocks=4096) == [seed_b]      # family 1 pinned to b
    for r in (seed_a, seed_b):
        core.on_done("a" if r is seed_a else "b", r)
    mine = [req(prefixed(1, 40, 10 + k), max_new=16) for k in range(4)]
    theirs = [req(prefixed(0, 40, 20 + k), max_new=120) for k in range(4)]
    for r in theirs + mine:
        core.add(r)
    assert core.take("b", free_slots=4, free_kv_blocks=4096) == mine  # its own short ones, no spill
    assert core.stats().affinity_spills == 0


@pytest.mark.parametrize("grouping", [False, True])
def test_requeue_goes_to_the_front_and_counts_the_attempt(grouping):
    core = BrokerCore([geom()], grouping=grouping)
    rs = [req(prefixed(k % 3, 40, k)) for k in range(9)]
    for r in rs:
        core.add(r)
    got = core.take("e0", free_slots=2, free_kv_blocks=4096)
    core.requeue(got)
    assert [r.attempt for r in got] == [1, 1]
    again = core.take("e0", free_slots=2, free_kv_blocks=4096)
    assert again == got
    core.requeue(again[::-1])                       # the order given is the order served
    assert core.take("e0", free_slots=1, free_kv_blocks=4096) == [again[1]]
    assert again[1].attempt == 2
    assert core.pending() == 8 and core.in_flight() == 1


def test_requeue_is_accepted_when_full_and_a_duplicate_requeue_is_a_no_op():
    core = BrokerCore([geom()], max_pending=2)
    a, b = req(range(20)), req(range(20))
    core.add(a)
    core.add(b)
    with pytest.raises(QueueFull):
        core.add(req(range(20)))
    taken = core.take("e0", free_slots=1, free_kv_blocks=4096)
    core.add(req(range(20)))
    core.requeue(taken)  # over max_pending: requeued work is never refused
    assert core.pending() == 3 and not core.has_room()
    core.requeue(taken)                              # already pending: nothing happens
    assert core.pending() == 3 and taken[0].attempt == 1


def test_no_engine_fits_names_lengths_and_limits():
    core = BrokerCore(
        [geom("cpu0", max_in=100, max_out=16, tpb=16, kv=7), geom("cpu1", tok="u", max_in=500)],
        node="local",
    )
    r = req(range(120), max_new=4)
    assert core.fitting_engines(r) == []
    with pytest.raises(NoEngineFits) as ei:
        core.add(r)
    msg = str(ei.value)
    assert "local" in msg and r.request_id in msg and "t: 120" in msg and "max_new_tokens 4" in msg
    assert "prompt 120 tokens > max_input_len 100" in msg
    assert "cpu1" in msg and "no prompt for its tokenizer 'u'" in msg
    with pytest.raises(NoEngineFits, match="needs 8 KV blocks of 16 > the pool's 7"):
        core.add(req(range(100), max_new=16))

    with pytest.raises(NoEngineFits, match="max_new_tokens 17 > max_output_len 16"):
        core.add(req(range(10), max_new=17))
    assert core.stats().no_fit == 3 and core.pending() == 0


def test_no_engine_fits_says_what_is_wrong_first_and_internal_ids_last():
    core = BrokerCore(
        [geom("cpu0", max_in=100, max_out=16), geom("cpu1", max_in=100, max_out=16)], node="local"
    )
    r = req(range(120), max_new=4)
    with pytest.raises(NoEngineFits) as ei:
        core.add(r)
    msg = str(ei.value)
    assert msg.startswith(
        "prompt 120 tokens > max_input_len 100: it fits no engine on node local ("
    ), msg
    assert msg.endswith(f"request {r.request_id}, prompt tokens per tokenizer t: 120)"), msg


def test_requests_only_reach_engines_they_fit():
    small, big = geom("small", max_in=64), geom("big", max_in=512)
    core = BrokerCore([small, big])
    long_ones = [req(range(300)) for _ in range(5)]
    short = [req(range(30)) for _ in range(5)]
    for r in long_ones + short:
        core.add(r)
    assert core.fitting_engines(long_ones[0]) == ["big"]
    got_small = [r for _ in range(5) for r in core.take("small", free_slots=8, free_kv_blocks=4096)]
    assert got_small and all(len(r.prompts["t"]) <= 64 for r in got_small)
    # the specialised engine serves what only it can run before shared work
    assert core.take("big", free_slots=1, free_kv_blocks=4096)[0] in long_ones


def test_duplicate_request_id_is_refused():
    core = BrokerCore([geom()])
    core.add(req(range(5), rid="x"))
    with pytest.raises(ValueError, match="already queued"):
        core.add(req(range(5), rid="x"))
