"""The local node over both card transports (a worker process per card, or the card's host on the
node's own loop): the same answers, embeddings, stats and failure handling; the node-side tokenizer
copy and its fallback; typed refusals from the real tiny engine reach the caller as
RequestRejected."""
from __future__ import annotations

import asyncio

import pytest

from forge.config.load import load_node
from forge.errors import NodeDown, RequestRejected
from forge.functions.api import GenerateParams
from forge.node.local import LocalNode
from tests.reliability._rel import NODES

TRANSPORTS = ("process", "thread")


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_answers_embeddings_and_stats_are_the_same_over_both_transports(transport):
    async def main():
        node = LocalNode(load_node(NODES / "instant.yaml"), card_transport=transport)
        await node.start()
        try:
            gens = await asyncio.gather(*(node.generate(f"prompt {i}", GenerateParams(max_tokens=5))
                                          for i in range(300)))
            hidden = await node.embed("an embedding")
            ans = await node.submit([5, 6, 7], GenerateParams(max_tokens=3, priority=2))
            (st,) = node.engine_stats()
            (link,) = node.links.values()
            return gens, hidden, ans, st, node.describe(), node.healthy_cards(), link.info.gc
        finally:
            await node.stop()

    gens, hidden, ans, st, desc, healthy, desc_gc = run(main())
    import gc

    from forge.gc_tuning import GEN0_THRESHOLD

    # the node's collector setting
    assert gc.get_threshold()[0] == GEN0_THRESHOLD and gc.get_freeze_count() > 0
    # ... and the card's: a worker process tunes its own once its engine is loaded (the thread shares the node's)
    assert desc_gc["threshold"][0] == GEN0_THRESHOLD and desc_gc["frozen"] > 0
    assert all(
        g.card == "cpu0"
        and g.output_tokens == 5
        and g.finish_reason == "length"
        and g.input_tokens > 2
        for g in gens
    )
    assert len(hidden) == 16 and ans.hidden is None and ans.generation.input_tokens == 3
    assert st.requests_ok == 302 and st.healthy and healthy == ["cpu0"]
    (card,) = desc["cards"]
    assert card["transport"] == transport and card["state"] == "running" and card["healthy"]
    assert (card["pid"] == __import__("os").getpid()) == (transport == "thread")


def test_the_same_prompts_give_the_same_outputs_over_both_transports():
    async def outputs(transport):
        node = LocalNode(load_node(NODES / "instant.yaml"), card_transport=transport)
        await node.start()
        try:
            gens = await asyncio.gather(
                *(
                    node.generate(f"the same prompt {i}", GenerateParams(max_tokens=6))
                    for i in range(50)
                )
            )
            return [(g.text, g.token_ids, g.input_tokens) for g in gens]
        finally:
            await node.stop()

    assert run(outputs("process")) == run(outputs("thread"))


def test_a_failed_engine_on_the_thread_transport_fails_the_card_and_the_node_goes_down():
    async def main():
        node = LocalNode(load_node(NODES / "crash.yaml"), card_transport="thread")
        await node.start()
        try:
            results = await asyncio.gather(*(node.generate(f"p {i}", GenerateParams(max_tokens=2))
                                             for i in range(600)), return_exceptions=True)
            return results, node.down, node.describe()
        finally:
            await node.stop()

    results, down, desc = run(main())
    assert sum(not isinstance(r, BaseException) for r in results) == 300
    assert all(isinstance(r, NodeDown) for r in results if isinstance(r, BaseException))
    assert down.startswith("node crash: no engine can work (cpu0: engine failed: injected crash "
                           "after 300 results)")
    assert desc["cards"][0]["state"] == "failed"


def test_a_tokenizer_copy_that_does_not_encode_as_the_engine_is_not_used(monkeypatch, capsys):
    """The node then tokenizes through the card's host: the same ids as the engine's own
    tokenizer."""
    from forge_bench.engines.instant import ByteTokenizer
    from forge.host.engine_host import EngineHost

    async def wrong_copy(self):
        return ByteTokenizer(), [(t, list(self.tokenizer.encode(t))) for t in ("Hello, world!",)]

    monkeypatch.setattr(EngineHost, "tokenizer_copy", wrong_copy)

    async def main():
        node = LocalNode(load_node(NODES / "instant.yaml"), card_transport="thread")
        await node.start()
        try:
            gen = await node.generate("Hello, world!", GenerateParams(max_tokens=2))
            host = node.transports[0].host
            return (
                gen,
                node.tokenizers,
                list(node.encoders),
                len(host.tokenizer.encode("Hello, world!")),
            )
        finally:
            await node.stop()

    gen, copies, encoders, engine_len = run(main())
    assert copies == {} and len(encoders) == 1 and gen.input_tokens == engine_len
    assert "prompts are tokenized by the card's worker" in capsys.readouterr().err


@pytest.mark.engine
def test_the_node_side_copy_of_the_tiny_tokenizer_encodes_and_decodes_as_the_engine_does():
    pytest.importorskip("transformers")
    import json
    import pickle
    from pathlib import Path

    from forge.embedded import default_node_path
    from forge.engines.transformers.loading import load_tokenizer
    from forge.host.engine_host import PROBE_TEXTS
    from forge.host.tokenizer import NodeTokenizer, for_node

    plan = load_node(default_node_path()).plans[0]
    engine_tok = load_tokenizer(plan)
    copy = pickle.loads(pickle.dumps(for_node(engine_tok)))
    assert isinstance(copy, NodeTokenizer)
    data = Path(__file__).resolve().parents[2] / "functions" / "data" / "summarize.jsonl"
    texts = [*PROBE_TEXTS, *(json.loads(line)["text"] for line in data.read_text().splitlines())]
    for t in texts:
        ids = engine_tok.encode(t)
        assert copy.encode(t) == ids, t
        assert copy.decode(ids) == engine_tok.decode(ids), t


@pytest.mark.engine
def test_a_refused_request_is_rejected_not_failed():
    """The tiny engine refuses a choice that cannot fit max_tokens (a typed refusal, across the
    worker's link)."""
    from forge.embedded import default_node_path

    async def main():
        node = LocalNode(load_node(default_node_path()))
        await node.start()
        try:
            with pytest.raises(RequestRejected, match="cannot hold the shortest choice"):
                await node.generate(
                    "Is it?",
                    GenerateParams(max_tokens=1, choice=("the Queen of Hearts", "the King")),
                )
            ok = await node.generate("Is it?", GenerateParams(max_tokens=8, choice=("yes", "no")))
            return ok
        finally:
            await node.stop()

    assert run(main()).text in ("yes", "no")


def test_an_unknown_card_transport_is_refused():
    from forge.errors import ForgeError

    with pytest.raises(ForgeError, match="card_transport must be one of process, thread"):
        LocalNode(load_node(NODES / "instant.yaml"), card_transport="carrier-pigeon")


@pytest.mark.engine
def test_a_card_with_replicas_runs_one_worker_per_replica():
    """`replicas: 2` on one card of the tiny model: two engines, two worker processes, one broker
    over both."""
    from pathlib import Path

    async def main():
        node = LocalNode(load_node(Path(__file__).parent / "fixtures" / "replicas-tiny.yaml"))
        await node.start()
        try:
            gens = await asyncio.gather(
                *(
                    node.generate(f"Alice was beginning {i}", GenerateParams(max_tokens=4))
                    for i in range(96)
                )
            )
            return gens, node.describe(), [s.card for s in node.engine_stats()]
        finally:
            await node.stop()

    gens, desc, stat_cards = run(main())
    assert {g.card for g in gens} == {"cpu0.r0", "cpu0.r1"}
    assert [c["card"] for c in desc["cards"]] == ["cpu0.r0", "cpu0.r1"] == stat_cards
    assert [c["replica"] for c in desc["cards"]] == [0, 1]
    pids = {c["pid"] for c in desc["cards"]}
    assert len(pids) == 2 and __import__("os").getpid() not in pids


def test_token_id_prompts_of_every_shape_are_checked_and_sent_as_the_same_ids():
    """Plain ints (list or tuple) take the node's fast path; bools, int subclasses, out-of-range ids
    and other containers take the general checks: the same ids reach the engine, the same refusals
    reach the caller."""
    class Tok(int):
        pass

    async def main():
        node = LocalNode(load_node(NODES / "instant.yaml"), card_transport="thread")
        await node.start()
        try:
            params = GenerateParams(max_tokens=2)
            got = [await node.submit(p, params) for p in ([5, 6, 7], (5, 6, 7), [Tok(5), 6, 7], [])]
            refused = []
            for bad in ([5, -1], [5, 2**31], [True, 6], (5, 6.0), {5, 6}, "x\ud800"):
                with pytest.raises(RequestRejected) as e:
                    await node.submit(bad, params)
                refused.append(str(e.value))
            return got, refused
        finally:
            await node.stop()

    got, refused = run(main())
    assert [a.generation.input_tokens for a in got] == [3, 3, 3, 0]
    assert got[0].generation == got[1].generation == got[2].generation
    assert refused[:4] == ["prompt token 1 is -1; token ids are ints in [0, 2**31 - 1]",
                           f"prompt token 1 is {2**31}; token ids are ints in [0, 2**31 - 1]",
                           "prompt token 0 is True; token ids are ints in [0, 2**31 - 1]",
                           "prompt token 1 is 6.0; token ids are ints in [0, 2**31 - 1]"]
    assert refused[4] == "prompt must be a string or a list of token ids, got set"
    assert refused[5].startswith("prompt is not valid Unicode text")
