"""The declared seam between a link and its engine host (forge/host/protocol.py): every HostMethod
is a coroutine of EngineHost and a typed method of the Transport base with the same positional
arguments, and nothing else is; the records survive pickling (the worker-process and Ray carriers),
batches of them as plain tuples."""
from __future__ import annotations

import inspect
import pickle

from forge.broker import EngineGeometry
from forge.host.engine_host import EngineHost
from forge.host.protocol import (
    Collected,
    Delivered,
    Hello,
    HostMethod,
    WireRequest,
    WireResult,
    requests_received,
    requests_to_send,
)
from forge.link.transport import Transport
from forge.requests import RequestOptions
from forge.stats import EngineStats

# what a carrier implements; the rest is the protocol
CARRIER_METHODS = {"call", "reconnect", "close"}


def public_coroutines(cls: type) -> set[str]:
    return {
        n for n, f in inspect.getmembers(cls, inspect.iscoroutinefunction) if not n.startswith("_")
    }


def positional(fn) -> list[str]:
    return [p.name for p in list(inspect.signature(fn).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_every_host_method_is_declared_on_the_host_and_the_transport_and_nothing_else_is():
    declared = {m.value for m in HostMethod}
    assert public_coroutines(EngineHost) == declared
    assert public_coroutines(Transport) - CARRIER_METHODS == declared
    for m in HostMethod:
        host, typed = getattr(EngineHost, m.value), getattr(Transport, m.value)
        assert len(positional(typed)) == len(positional(host)), (
            m,
            positional(typed),
            positional(host),
        )
        # every call of a peer is bounded
        assert "timeout_s" in inspect.signature(typed).parameters, m


def request(i: int, options=None) -> WireRequest:
    return WireRequest(f"j-1:{i:x}", i % 3, (1, 2, 3, i), 16, i % 2, options, 0.25 * i)


def result(i: int) -> WireResult:
    return WireResult(
        f"j-1:{i:x}", 1, "length", [7, 8, i], "seven eight", None if i % 2 else [0.5, 1.5], None, 4
    )


def test_a_submit_batch_crosses_as_plain_tuples_and_is_rebuilt():
    batch = [request(i, RequestOptions(deadline_s=3.0) if i == 2 else None) for i in range(5)]
    sent = requests_to_send(batch)
    assert all(type(t) is tuple for t in sent)
    data = pickle.dumps(sent, protocol=5)
    assert b"WireRequest" not in data                    # no class reference per item on the wire
    back = requests_received(pickle.loads(data))
    assert back == batch and all(type(r) is WireRequest for r in back)
    assert (
        back[2].options.deadline_s == 3.0
        and back[3].age_s == 0.75
        and back[4].prompt == (1, 2, 3, 4)
    )


def test_collected_pickles_its_results_as_plain_tuples_and_comes_back_whole():
    stats = EngineStats(
        node="n", card="cpu0", tier="t", token_budget=64, slots=4, kv_blocks_total=8, in_flight=2
    )
    reply = Collected(
        [result(i) for i in range(4)],
        [("j-1:9", 0)],
        Delivered(12, 0.5, 0.75),
        True,
        incarnation="abc",
        healthy=False,
        accepting=True,
        state="stalled",
        failure=None,
        stats=stats,
    )
    data = pickle.dumps(reply, protocol=5)
    assert b"WireResult" not in data and b"Delivered" not in data
    back = pickle.loads(data)
    assert back == reply
    assert all(type(r) is WireResult for r in back.results) and type(back.delivered) is Delivered
    assert (
        back.results[0].hidden == [0.5, 1.5]
        and back.delivered.occupancy == 0.75
        and back.stats.in_flight == 2
    )
    ended = pickle.loads(pickle.dumps(Collected.ended_session("abc")))
    assert (
        ended.ended and ended.incarnation == "abc" and ended.results == [] and ended.stats is None
    )


def test_hello_pickles_with_its_geometry_and_stats():
    geom = EngineGeometry(
        engine_id="i1/cpu0",
        tokenizer_key="tok-1",
        max_batch_size=4,
        max_num_tokens=256,
        max_input_len=64,
        max_output_len=16,
        tokens_per_block=16,
        kv_blocks_total=32,
    )
    hello = Hello(
        engine_id="i1/cpu0",
        incarnation="abc",
        node="i1",
        card="cpu0",
        replica=0,
        model="cpu",
        tier="t",
        backend="instant",
        geometry=geom,
        host="h",
        pid=1,
        load_s=0.1,
        started_at=1.0,
        limits={"max_batch_size": 4},
        kv_blocks=32,
        full_length_slots=4,
        guides=["choice"],
        hidden=False,
        engine={},
        lifeline={},
        gc={"threshold": [700, 10, 10], "frozen": 0},
        stats=EngineStats(
            node="i1", card="cpu0", tier="t", token_budget=256, slots=4, kv_blocks_total=32
        ),
        guard={"pdeathsig": True},
        ray_node_id="r1",
    )
    back = pickle.loads(pickle.dumps(hello, protocol=5))
    assert back == hello and back.geometry == geom and back.guard == {"pdeathsig": True}
