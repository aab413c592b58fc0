"""The Transport base's typed methods: each is one call of its HostMethod with its arguments in
order and the caller's timeout, a submit's batch as plain tuples (the carrier may pickle it), the
answer passed back as is."""
from __future__ import annotations

import asyncio

from forge.host.protocol import HostMethod, WireRequest
from forge.link.transport import LinkGone, Transport


class Recording(Transport):
    """A carrier that records each call and answers with its method (pure logic: no host behind
    it)."""

    def __init__(self):
        self.calls: list[tuple] = []

    async def call(self, method, *args, timeout_s):
        self.calls.append((method, args, timeout_s))
        return method

    async def reconnect(self, why, *, engine_failed, incarnation):
        raise LinkGone(why)

    async def close(self, timeout_s):
        pass


def test_typed_methods_call_their_host_method_with_their_arguments():
    t = Recording()
    batch = [WireRequest("r1", 0, (1, 2), 4, 0, None, 0.5)]
    M = HostMethod
    expected = [  # the typed call, then what the carrier is asked: method, arguments
        (t.hello(timeout_s=1), M.HELLO, ()),
        (t.tokenizer_copy(timeout_s=2), M.TOKENIZER_COPY, ()),
        (t.encode(["a"], timeout_s=3), M.ENCODE, (["a"],)),
        (t.submit("s", batch, timeout_s=4), M.SUBMIT, ("s", [("r1", 0, (1, 2), 4, 0, None, 0.5)])),
        (t.collect("s", 0.5, 64, timeout_s=5), M.COLLECT, ("s", 0.5, 64)),
        (t.cancel("s", [("r1", 0)], timeout_s=6), M.CANCEL, ("s", [("r1", 0)])),
        (t.end_session("s", timeout_s=7), M.END_SESSION, ("s",)),
        (t.stats(timeout_s=8), M.STATS, ()),
        (t.drain(9.0, timeout_s=10), M.DRAIN, (9.0,)),
        (t.stop(timeout_s=11), M.STOP, ()),
    ]
    assert {m for _, m, _ in expected} == set(HostMethod)

    async def main():
        return [await call for call, _, _ in expected]

    answers = asyncio.run(main())
    assert [(m, a) for m, a, _ in t.calls] == [(m, a) for _, m, a in expected]
    assert [s for _, _, s in t.calls] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    assert type(t.calls[3][1][1][0]) is tuple  # the batch as plain tuples, not records
    assert answers == [None if m in (M.END_SESSION, M.STOP) else m for _, m, _ in expected]
