"""Every request of a cluster job ends (issue 13, items 3 and 4): a prompt no tokenizer takes, a
short answer from the tokenizing engine, a request that cannot be put on the wire, a reply the link
cannot read, an engine that goes silent. The engine actor's body is the real EngineHost with the
instant engine, behind the in-process handle of test_cluster_units (Ray's calling convention; faults
are injected into that handle)."""
from __future__ import annotations

import asyncio
import time

import pytest

from forge.broker import Broker, BrokerCore, BrokerRequest
from forge.cluster import actor, client
from forge.cluster.actor import RayTransport
from forge.cluster.client import ClusterNode
from forge.host.protocol import WireResult
from forge.link import encoder, link as links
from forge.link.link import EngineLink
from forge.errors import NodeDown, RequestRejected
from forge.functions.api import GenerateParams
from tests.cluster.test_cluster_units import InProcessHandle, make_host


class FaultyHandle(InProcessHandle):
    """The in-process handle with one method's answer replaced by `faults[name](real answer or
    None)`, or a call that never returns (`silent`, like a frozen actor process)."""

    def __init__(self, target, **faults):
        super().__init__(target)
        self.faults, self.silent = faults, False

    def __getattr__(self, name):
        real = super().__getattr__(name)
        handle = self

        class Remote:
            @staticmethod
            def remote(*args):
                async def call():
                    if handle.silent:
                        await asyncio.sleep(3600)
                    answer = await real.remote(*args)
                    fault = handle.faults.pop(name, None)
                    return fault(answer) if fault else answer
                return asyncio.ensure_future(call())
        return Remote()


async def _node(handle, host, **kw) -> ClusterNode:
    node = ClusterNode("test", **kw)
    node.attach([("engine:i1/cpu0", handle, await host.hello())])
    return node


def test_a_prompt_no_tokenizer_takes_fails_alone():
    async def main():
        host = make_host()
        node = await _node(InProcessHandle(host), host)
        calls = [
            node.generate(p, GenerateParams(max_tokens=3)) for p in ("one", "bad \udc80", "three")
        ]
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        await node.stop()
        await host.stop()
        return got

    one, bad, three = asyncio.run(main())
    assert one.output_tokens == 3 and three.output_tokens == 3
    assert isinstance(bad, RequestRejected) and "lone surrogate" in str(bad)


def test_a_short_answer_from_the_tokenizing_engine_ends_every_call():
    async def main():
        host = make_host()
        # one token list for a batch of texts
        handle = FaultyHandle(host, encode=lambda ids: ids[:1])
        node = await _node(handle, host)
        calls = [node.generate(f"prompt {i}", GenerateParams(max_tokens=3)) for i in range(5)]
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        await node.stop()
        await host.stop()
        return got

    got = asyncio.run(main())
    assert all(isinstance(g, NodeDown) and "answered 1 of 5 texts" in str(g) for g in got), got


def test_a_request_that_cannot_be_put_on_the_wire_fails_alone(monkeypatch):
    real = links.to_wire

    def to_wire(req, key, now):
        if req.request_id == "r7":
            raise ValueError("cannot pickle this request")
        return real(req, key, now)

    monkeypatch.setattr(links, "to_wire", to_wire)
    got = asyncio.run(_link_job(InProcessHandle, n=20))
    assert isinstance(got["r7"], RuntimeError) and "cannot be sent to engine i1/cpu0" in str(
        got["r7"]
    )
    assert all(
        isinstance(v, WireResult) and v.finish_reason == "length"
        for k, v in got.items()
        if k != "r7"
    )


def test_a_reply_the_link_cannot_read_is_a_loss_and_nothing_is_lost(monkeypatch):
    monkeypatch.setattr(actor, "REATTACH_INTERVAL_S", 0.05)
    got = asyncio.run(
        _link_job(lambda host: FaultyHandle(host, collect=lambda reply: {"garbled": True}), n=50)
    )
    assert len(got) == 50 and all(
        isinstance(v, WireResult) and v.finish_reason == "length" for v in got.values()
    )


def test_a_silent_engine_is_lost_within_the_stall_window_and_the_job_told(monkeypatch):
    monkeypatch.setattr(links, "CALL_TIMEOUT_S", 0.5)              # the stall window, scaled down
    monkeypatch.setattr(encoder, "CALL_TIMEOUT_S", 0.5)
    monkeypatch.setattr(links, "COLLECT_WAIT_S", 0.1)
    monkeypatch.setattr(client, "SWEEP_INTERVAL_S", 0.05)

    async def main():
        host = make_host()
        handle = FaultyHandle(host)
        node = await _node(handle, host, down_grace_s=0.3)
        await node.generate("warm", GenerateParams(max_tokens=2))
        handle.silent = True  # SIGSTOP, as far as the driver can tell
        t0 = time.monotonic()
        # no engine tokenized it, or the one it fits has been gone for 0.3 s
        with pytest.raises(NodeDown):
            await asyncio.wait_for(node.generate("then nothing", GenerateParams(max_tokens=2)), 10)
        took = time.monotonic() - t0
        link = next(iter(node.links.values()))
        # its long poll ends within the window too
        while link.state == "up" and time.monotonic() - t0 < 2.0:
            await asyncio.sleep(0.05)
        lost = link.state
        await node.stop()
        await host.stop()
        return took, lost

    took, lost = asyncio.run(main())
    assert lost == "down" and took < 0.5 + 0.1 + 0.3 + 1.5     # noticed within the (scaled) window


async def _link_job(make_handle, n: int) -> dict:
    """n requests through one EngineLink over the real host; returns rid -> result tuple or the
    exception."""
    host = make_host()
    info = await host.hello()
    handle = make_handle(host)
    broker = Broker(BrokerCore([info.geometry], node="test"))
    done: dict[str, asyncio.Future] = {}
    link = EngineLink(RayTransport("engine:i1/cpu0", handle), info, broker=broker, rid_prefix="j",
                      settle=lambda req, eid, res: done[req.request_id].set_result(res),
                      fail=lambda req, msg: done[req.request_id].set_exception(RuntimeError(msg)))
    link.start()
    key = host.tokenizer_key
    ids = tuple((await host.encode(["a prompt"]))[0])
    for i in range(n):
        done[f"r{i}"] = asyncio.get_running_loop().create_future()
        await broker.put(BrokerRequest(request_id=f"r{i}", prompts={key: ids}, max_new_tokens=4))
    results = await asyncio.wait_for(asyncio.gather(*done.values(), return_exceptions=True), 20)
    await link.close()
    await host.stop()
    return dict(zip(done, results))
