"""Cancelling the caller of Node.submit takes the request back: dropped while it is still queued (in
the node's broker or in its card's host), cancelled in the engine once it runs - across the link to
the card's worker process; the slot and KV reservation come back when the engine lets go."""
from __future__ import annotations

import asyncio
import time

import pytest

from forge.functions.api import GenerateParams
from forge.requests.guided import guided_output_problem
from forge.requests import RequestOptions
from forge.engines.interface import Guide

pytestmark = pytest.mark.engine
LONG = "1, 2, 3, 4, 5, 6, 7,"


def test_request_options_are_built_once_from_the_params():
    o = RequestOptions.of(GenerateParams(max_tokens=4, top_k=3, choice=("a",), deadline_s=2.0))
    assert (
        o.sampling.top_k == 3
        and o.guide.choice == ("a",)
        and o.deadline_s == 2.0
        and not o.want_hidden
    )
    assert RequestOptions.of(GenerateParams(max_tokens=4, embed=True)).want_hidden
    # defaults travel as nothing
    assert RequestOptions.of(GenerateParams(max_tokens=4, priority=5)) is None


def test_guided_output_check():
    assert guided_output_problem("yes", Guide(choice=("yes", "no"))) is None
    assert "not one of the choices" in guided_output_problem("maybe", Guide(choice=("yes", "no")))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert guided_output_problem('{"a": 1}', Guide(json_schema=schema)) is None
    assert "not JSON" in guided_output_problem('{"a": ', Guide(json_schema=schema))
    assert "does not match the schema" in guided_output_problem(
        '{"a": "x"}', Guide(json_schema=schema)
    )


def test_cancelled_callers_leave_nothing_behind():
    from forge.config.load import load_node
    from forge.embedded import default_node_path
    from forge.node.local import LocalNode

    async def main():
        node = LocalNode(load_node(default_node_path()))
        await node.start()
        try:
            def card():
                return node.engine_stats()[0]  # the card's own numbers, as its worker reports them

            params = GenerateParams(max_tokens=128)
            # 32 slots: the first 32 run; the link sends 8 more ahead (credit), the rest wait in the
            # node's broker
            tasks = [asyncio.ensure_future(node.submit(LONG, params)) for _ in range(48)]
            deadline = time.monotonic() + 20
            while card().in_flight < 32:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            queued = node.broker.pending()
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            while any((card().in_flight, card().kv_blocks_reserved, node.broker.pending(),
                       sum(len(lk.out) for lk in node.links.values()))):
                assert time.monotonic() < deadline, card()
                await asyncio.sleep(0.02)
            st = card()
            assert node.abandoned == 48 and node.open_requests() == 0 and queued >= 1
            assert st.requests_cancelled == 48 and st.requests_ok == 0
            # the node still works
            gen = await node.generate("Alice was beginning to", GenerateParams(max_tokens=8))
            assert gen.output_tokens > 0
        finally:
            await node.stop()

    asyncio.run(main())
