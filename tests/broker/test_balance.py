"""Several cards, one queue: a deterministic simulation where each engine works at its own speed and
pulls when it has free slots (helpers.simulate). Shares follow measured speed; the tail is not
hoarded."""
from __future__ import annotations

import random

import pytest

from forge.broker import BrokerCore

from .helpers import SimEngine, geom, prefixed, req, simulate


def _requests(n: int, *, seed: int = 1, families: int = 16, lengths=(40, 200)):
    rnd = random.Random(seed)
    return [
        req(prefixed(k % families, rnd.randint(*lengths), k), max_new=rnd.randint(8, 64))
        for k in range(n)
    ]


def _run(grouping: bool, speeds=(24.0, 8.0), n: int = 1200, **core_kw):
    geoms = [geom(f"g{k}", slots=8, budget=1024) for k in range(len(speeds))]
    core = BrokerCore(geoms, grouping=grouping, **core_kw)
    sims = [SimEngine(g, s) for g, s in zip(geoms, speeds)]
    reqs = _requests(n)
    ticks = simulate(core, sims, reqs)
    total_work = sum(len(r.prompts["t"]) + r.max_new_tokens for r in reqs)
    ideal = total_work / sum(speeds)
    return core, sims, ticks, ideal, total_work


@pytest.mark.parametrize("grouping", [True, False])
def test_two_engines_at_3_to_1_share_the_queue_3_to_1(grouping):
    core, sims, ticks, ideal, total = _run(grouping)
    fast, slow = (sum(len(r.prompts["t"]) + r.max_new_tokens for r in e.done) for e in sims)
    assert fast + slow == total
    assert 0.70 <= fast / total <= 0.80, (fast, slow)
    # the slow card did not hold on to the last work: the run ends close to the ideal makespan
    assert ticks <= 1.08 * ideal, (ticks, ideal)
    assert core.in_flight() == 0 and core.pending() == 0


def test_tail_rule_shortens_the_end_of_the_run():
    """Without the tail rule (an infinite slack disables it) the slow card grabs its last full set
    of slots and the fast card idles while it finishes them: arrival order (FIFO) 2,012 ticks with
    the rule, 2,101 without; grouped 2,022 and 2,085 (ideal 1,950). Grouped mode serves the longest
    requested outputs first, which on a real engine sets the tail (a request lives about
    max_new_tokens steps); in this simulation a request's time is its whole work, prompt included
    (40-200 prompt tokens against 8-64 new), so output order barely shortens it here."""
    _, _, with_rule, ideal, _ = _run(False, n=400)
    _, _, without, _, _ = _run(False, n=400, tail_slack=1e9)
    assert with_rule < without
    assert with_rule <= 1.1 * ideal
    _, _, grouped, _, _ = _run(True, n=400)
    _, _, grouped_without, _, _ = _run(True, n=400, tail_slack=1e9)
    assert grouped < grouped_without and grouped <= 1.05 * ideal


def test_three_engines_share_by_speed_while_producers_feed_the_queue():
    speeds = (30.0, 20.0, 10.0)
    geoms = [geom(f"g{k}", slots=6, budget=1024) for k in range(3)]
    core = BrokerCore(geoms, grouping=True, max_pending=256)
    sims = [SimEngine(g, s) for g, s in zip(geoms, speeds)]
    reqs = _requests(1500, seed=3)
    simulate(core, sims, reqs, feed_per_tick=8)
    shares = [sum(len(r.prompts["t"]) + r.max_new_tokens for r in e.done) for e in sims]
    total = sum(shares)
    for got, want in zip(shares, (0.5, 1 / 3, 1 / 6)):
        assert abs(got / total - want) < 0.05, shares


def test_an_unhealthy_engine_leaves_everything_to_the_others():
    geoms = [geom("g0", slots=8), geom("g1", slots=8)]
    core = BrokerCore(geoms, grouping=True)
    sims = [SimEngine(geoms[0], 24.0), SimEngine(geoms[1], 8.0, healthy=False)]
    core.set_engine_healthy("g1", False)
    simulate(core, sims, _requests(300))
    assert len(sims[0].done) == 300 and not sims[1].done


def test_throughput_estimate_is_an_ewma_of_deliveries():
    core = BrokerCore([geom("a", budget=100), geom("b", budget=300)])
    assert core.loads()["a"]["tokens_per_s"] is None
    assert core.loads()["b"]["weight"] == 3 * core.loads()["a"]["weight"]  # prior: token budgets
    core.record_delivery("a", 1000, 1.0)
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(1000)
    # unmeasured: prior scaled by measured
    assert core.loads()["b"]["weight"] == pytest.approx(3000)
    core.record_delivery("a", 1000, 1.0)
    core.record_delivery("a", 2000, 1.0)  # early on: the time-weighted mean so far
    assert 1300 < core.loads()["a"]["tokens_per_s"] < 1400
    core.record_delivery("a", 50_000, 50.0)  # ten half-lives at 1000/s: the past is forgotten
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(1000, rel=0.001)
    core.record_delivery("a", 0, 5.0)  # one half-life of nothing halves it
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(500, rel=0.001)
    core.record_delivery("a", 10, 0.0)                           # no elapsed time: ignored
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(500, rel=0.001)


def test_a_first_delivery_that_reads_low_does_not_stay():
    """Deliveries are counted as requests finish: a card's first one (from the moment it got a full
    batch to its first answer) reads a fraction of its speed. forge bench scaling's 3:1 cell
    (instant cards at 4 and 12 ms per step): the slow card's first sample read 646 tokens/s while it
    delivered ~8,600; seeded with it, the 5 s EWMA read 1,103 half a second later, the
    finishing-time rule stopped giving it work long before the end, and on the device the fast card
    took 80 % of the tokens where its speed share was 73 %."""
    core = BrokerCore([geom("fast", slots=32), geom("slow", slots=32)])
    core.record_delivery("fast", 3000, 0.1)  # a pipeline fill at each card's start, then
    core.record_delivery("slow", 120, 0.19)  # 50 deliveries over 1 s at 30,000 and 10,000
    for _ in range(50):
        core.record_delivery("fast", 600, 0.02)
        core.record_delivery("slow", 200, 0.02)
    fast, slow = (core.loads()[e]["tokens_per_s"] for e in ("fast", "slow"))
    assert slow > 0.8 * 10_000, slow
    assert 2.7 < fast / slow < 3.6, (fast, slow)


def _shares(sims) -> list[float]:
    work = [sum(len(r.prompts["t"]) + r.max_new_tokens for r in e.done) for e in sims]
    return [w / sum(work) for w in work]


@pytest.mark.parametrize("families", [1, 16])
@pytest.mark.parametrize("in_system", [16, 32, 64])
@pytest.mark.parametrize("owner", ["fast", "slow"])
def test_a_closed_loop_is_shared_by_speed_whichever_card_owns_the_prefixes(
    owner, in_system, families
):
    """A function pool keeps `in_system` requests pending or in flight (1, 2 and 4 x the cards' 16
    slots), so the broker only ever sees a window of the job. Before the work-conserving spill and
    the stream-aware tail rule, a slow card starved here (fast card 0.87-0.99 of the work, the run
    17-34 % longer than ideal): the owner of a hot group kept it within 1.25 x the mean load, and
    the finishing-time rule read every moment of the stream as the end of the run."""
    speeds = (24.0, 8.0)
    geoms = [geom(f"g{k}", slots=8, budget=1024) for k in range(2)]
    core = BrokerCore(geoms, grouping=True)
    sims = [SimEngine(g, s) for g, s in zip(geoms, speeds)]
    first = geoms[0 if owner == "fast" else 1].engine_id
    seed = req(prefixed(0, 100, 10**6), max_new=32)
    core.add(seed)
    # family 0 pinned to `owner`
    assert core.take(first, free_slots=1, free_kv_blocks=4096) == [seed]
    core.on_done(first, seed)
    reqs = _requests(1200, families=families)
    ticks = simulate(core, sims, reqs, in_system=in_system)
    fast, slow = _shares(sims)
    assert 0.70 <= fast <= 0.80, (fast, slow)
    total = sum(len(r.prompts["t"]) + r.max_new_tokens for r in reqs)
    assert ticks <= 1.10 * total / sum(speeds), ticks
    s = core.stats()
    if families == 1 and in_system > 16:
        # the group stays pinned to its owner; what the other card takes is counted as spilled
        mine = 0.75 if owner == "fast" else 0.25
        assert abs(s.affinity_hits / s.dispatched - mine) < 0.07, (
            s.affinity_hits,
            s.affinity_spills,
        )
    elif families > 1 and in_system > 16:
        assert s.affinity_spills < 0.15 * s.dispatched, (s.affinity_hits, s.affinity_spills)


def test_a_card_measured_while_half_idle_is_not_taken_for_a_slow_one():
    """Speed is what a card delivers per busy slot, times its slots: a card that held 2 of its 8
    slots for a second and delivered 100 tokens runs at 400 tokens/s full, not 100."""
    core = BrokerCore([geom("a", slots=8)])
    core.record_delivery("a", 100, 1.0, 0.25)
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(400)
    core.record_delivery("a", 400, 5.0, 0.0)  # busy means at least one slot: never divides by 0
    a1 = 1 - 0.5 ** (1 / 5)                   # the two samples' weights in the bias-corrected EWMA
    want = (0.5 * a1 * 400 + 0.5 * (80 * 8)) / (0.5 * a1 + 0.5)
    assert core.loads()["a"]["tokens_per_s"] == pytest.approx(want)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_short_run_of_batching_cards_at_3_to_1_is_shared_3_to_1(seed):
    """forge bench scaling's 3:1 cell in miniature: CPU-bound instant cards (a token budget shared
    by the requests they hold), deliveries reported as requests finish, 8 warm-up requests (as the
    bench sends), then everything at once, a run of about half a speed half-life (there 2.8 s
    against 5 s). With the EWMA seeded by each card's first report, the slow card's pipeline-fill
    report (a full batch in, one answer out) set its speed for the whole run: the fast card took
    0.72-0.85 of the work and the run ended up to 14 % past the ideal (seeds 1-8); on the device,
    80.3 %."""
    speeds = (24.0, 8.0)
    geoms = [geom(f"g{k}", slots=8, budget=1024) for k in range(2)]
    # ticks: ~1.8 x this run's makespan
    core = BrokerCore(geoms, grouping=True, speed_half_life_s=2600.0)
    sims = [SimEngine(g, s) for g, s in zip(geoms, speeds)]
    simulate(core, sims, _requests(8, seed=seed + 100), at_completion=True)
    for e in sims:
        e.done.clear()
    reqs = _requests(200, seed=seed)
    ticks = simulate(core, sims, reqs, at_completion=True)
    fast, slow = _shares(sims)
    assert 0.70 <= fast <= 0.80, (fast, slow)
    total = sum(len(r.prompts["t"]) + r.max_new_tokens for r in reqs)
    assert ticks <= 1.08 * total / sum(speeds), ticks
