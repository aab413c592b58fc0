"""The pure parts of admission: the in-flight table, the stall state machine, the delivery rate, and
the request a wire item becomes in the host."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.engines.interface import RequestKey, Sampling
from forge.host.flights import FlightTable
from forge.host.progress import DeliveryRate, Occupancy, StallWatch
from forge.host.request import HostRequest
from forge.host.wire import from_wire
from forge.requests import DEFAULT_OPTIONS, RequestOptions

pytestmark = pytest.mark.timeout(30)


def hreq(i: int, attempt: int = 0) -> HostRequest:
    return HostRequest(RequestKey("s", f"r{i}", attempt), (1, 2, 3), 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "release", "orphan", "returned", "forget"]),
                          st.integers(0, 30), st.integers(1, 5)), max_size=80))
def test_flight_table_reservation_always_adds_up_and_stays_bounded(ops):
    t = FlightTable(slots=6, kv_blocks=12)
    for op, i, blocks in ops:
        keys = sorted(t.live)
        if op == "add":
            t.add(hreq(i), blocks=blocks, input_tokens=3, deadline=None)
        elif op in ("release", "orphan") and keys:
            t.release(t.live[keys[i % len(keys)]], engine_holds=op == "orphan")
        elif op == "returned":
            pool = keys + sorted(t.orphans)
            if pool:
                t.returned(pool[i % len(pool)])
        elif op == "forget":
            t.forget_engine()
        assert t.reserved == sum(f.blocks for f in t.live.values()) + sum(t.orphans.values())
        assert t.in_flight() <= 6 and t.reserved <= 12


def test_flight_table_refuses_a_key_the_engine_still_holds():
    t = FlightTable(slots=4, kv_blocks=8)
    f = t.add(hreq(0), blocks=1, input_tokens=3, deadline=None)
    t.release(f, engine_holds=True)
    assert t.add(hreq(0), blocks=1, input_tokens=3, deadline=None) is None
    # the next attempt
    assert t.add(hreq(0, attempt=1), blocks=1, input_tokens=3, deadline=None) is not None
    assert t.returned(RequestKey("s", "r0", 0)) is None and t.reserved == 1 and t.in_flight() == 1


def test_youngest_running_is_the_last_admitted():
    t = FlightTable(slots=4, kv_blocks=8)
    flights = [t.add(hreq(i), blocks=1, input_tokens=3, deadline=None) for i in range(3)]
    assert t.youngest_running() is None                   # none is in the engine yet
    for f in flights:
        f.state = "running"
    assert t.youngest_running() is flights[2]


def test_stall_watch_pause_then_take_back_then_wedged_then_recovery():
    w = StallWatch(window_s=1.0, takeback_interval_s=0.25, now=0.0)
    assert w.check(0.9, owed=True, can_take_back=True) is None
    assert w.check(1.0, owed=True, can_take_back=True) == "pause"
    assert w.check(1.5, owed=True, can_take_back=True) is None  # the second window is the pause
    assert w.check(2.0, owed=True, can_take_back=True) == "take_back"
    assert w.check(2.1, owed=True, can_take_back=True) is None
    assert w.check(2.25, owed=True, can_take_back=True) == "take_back"
    assert w.check(2.5, owed=True, can_take_back=False) == "wedged"
    assert w.check(9.0, owed=True, can_take_back=False) is None
    assert w.progress(9.5) == "wedged" and w.state is None
    assert w.check(10.0, owed=True, can_take_back=True) is None


def test_stall_watch_ignores_silence_when_nothing_is_owed():
    w = StallWatch(window_s=1.0, takeback_interval_s=0.1, now=0.0)
    assert w.check(5.0, owed=False, can_take_back=False) is None
    assert w.check(5.9, owed=True, can_take_back=True) is None  # the clock restarted at 5.0
    assert w.check(6.0, owed=True, can_take_back=True) == "pause"


def test_delivery_rate_counts_busy_time_only():
    r = DeliveryRate(half_life_s=1.0)
    r.busy(10.0)
    assert r.delivered(100, 11.0) == pytest.approx(1.0) and r.tokens_per_s == pytest.approx(100)
    r.idle()
    r.busy(50.0)                                  # 39 s idle in between: not counted
    assert r.delivered(300, 51.0) == pytest.approx(1.0)
    assert 100 < r.tokens_per_s < 300


def test_occupancy_is_time_weighted_over_busy_time_only():
    o = Occupancy()
    assert o.take(0.0) == 1.0                     # nothing measured yet: the broker's old reading
    o.set(10.0, 0.25)
    o.set(11.0, 0.75)                             # 1 s at a quarter, then 1 s at three quarters
    assert o.take(12.0) == pytest.approx(0.5)
    o.set(12.0, 0.0)
    o.set(40.0, 1.0)                              # 28 s idle: not counted
    assert o.take(41.0) == pytest.approx(1.0)


def test_flight_table_occupancy_is_its_fuller_resource():
    t = FlightTable(slots=8, kv_blocks=100)
    t.add(hreq(0), blocks=50, input_tokens=3, deadline=None)
    assert t.occupancy() == pytest.approx(0.5)    # 1 of 8 slots, 50 of 100 blocks
    t.add(hreq(1), blocks=1, input_tokens=3, deadline=None)
    assert t.occupancy() == pytest.approx(0.51)


def test_a_wire_item_becomes_a_host_request_keyed_once_with_its_options_and_age():
    opts = RequestOptions(sampling=Sampling(temperature=0.5), want_hidden=True, deadline_s=3.0)
    now = time.monotonic()
    r = from_wire(("r7", 2, [5, 6, 7], 9, 1, opts, 1.5), "job-3", "tok", now)
    assert r.key == RequestKey("job-3", "r7", 2) and str(r.key) == "job-3|r7|2"
    assert r.prompt == (5, 6, 7) and r.max_new_tokens == 9 and r.priority == 1 and not r.abandoned
    assert r.options is opts and r.enqueued_at == pytest.approx(now - 1.5)
    plain = from_wire(("r8", 0, (1,), 1, 0, None, 0.0), "job-3", "tok", now)
    assert plain.options is DEFAULT_OPTIONS                    # None on the wire: the defaults
    with pytest.raises(ValueError, match="max_new_tokens"):
        from_wire(("r9", 0, (1,), -1, 0, None, 0.0), "job-3", "tok", now)


def test_an_engine_queue_adds_to_what_may_be_held_not_to_occupancy():
    """An engine that queues beyond its slots (vLLM) is handed up to slots + queue_slots, KV still
    bounding; the occupancy the broker's speed is measured against counts running slots only."""
    t = FlightTable(slots=4, kv_blocks=100, queue_slots=4)
    flights = [t.add(hreq(i), blocks=10, input_tokens=3, deadline=None) for i in range(9)]
    assert sum(f is not None for f in flights) == 8 and t.free_slots() == 0
    assert t.occupancy() == 1.0  # 4 running slots full; 80 of 100 blocks reserved
    for f in flights[:6]:
        t.returned(f.key)
    assert t.free_slots() == 6 and t.occupancy() == 0.5    # 2 held: half the slots; 20 blocks
    tight = FlightTable(slots=4, kv_blocks=25, queue_slots=4)
    assert (
        sum(
            tight.add(hreq(i), blocks=10, input_tokens=3, deadline=None) is not None
            for i in range(8)
        )
        == 2
    )


def test_a_links_credit_covers_the_engines_queue_too():
    from forge.broker import EngineGeometry
    from forge.link.credit import CREDIT_FACTOR, Credit

    g = EngineGeometry(
        engine_id="cpu0",
        tokenizer_key="k",
        max_batch_size=32,
        max_num_tokens=512,
        max_input_len=384,
        max_output_len=128,
        tokens_per_block=32,
        kv_blocks_total=512,
    )
    assert Credit(g).free_slots() == int(32 * CREDIT_FACTOR)
    assert Credit(replace(g, queue_slots=32)).free_slots() == int(64 * CREDIT_FACTOR)
    with pytest.raises(ValueError, match="queue_slots"):
        replace(g, queue_slots=-1)
