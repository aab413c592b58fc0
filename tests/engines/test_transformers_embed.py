"""`embed` on the transformers backend gives one vector per text, whatever else the card is doing
(issue 49).

The generation loop runs its forwards in its own thread while embeds run theirs, over one model;
transformers' forward writes the model config's `is_causal` for the length of each call. These run
the real tiny model, on the engine and through a node, and compare each embed with that text's embed
taken alone on an idle card.
"""
from __future__ import annotations

import asyncio
import math
import time

import pytest

from forge.engines.interface import Sampling
from tests.engines.test_transformers_backend import TINY, contract, req, run_all, start
from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.engine
skip_module_unless_installed("torch", "transformers")

RELATIVE_TOLERANCE = 1e-5
TEXT = "Alice was beginning to get very tired"
# of different lengths, and some sharing TEXT's prefix (the KV blocks the prefix cache would hand
# back)
NEIGHBOURS = (
    f"{TEXT} of sitting by her sister on the bank",
    "The Mock Turtle said",
    TEXT,
    "`Off with her head!' the Queen shouted at the top of her voice " * 3,
    "Down the Rabbit-Hole",
    "Alice",
)


def off_by(got: list[float], want: list[float]) -> float:
    """|got - want| / |want|: the relative distance of two vectors."""
    assert len(got) == len(want) and want
    return math.sqrt(sum((g - w) ** 2 for g, w in zip(got, want))) / math.sqrt(
        sum(w * w for w in want)
    )


@pytest.fixture(scope="module")
def engine():
    eng = start(contract(TINY))
    yield eng
    eng.shutdown(10)


def embed_alone(engine, rid: str, text: str = TEXT) -> list[float]:
    return run_all(engine, [req(engine, rid, text, 0, want_hidden=True)])[0][rid].hidden


def test_an_embed_does_not_read_the_config_the_generation_loop_holds(engine):
    """What the loop's forward leaves on the shared config while it runs (its packed mask says
    is_causal=False) does not reach an embed taken meanwhile, and the embed leaves nothing on that
    config."""
    want = embed_alone(engine, "before")
    config = engine.model.config
    config.is_causal = False                     # as during one of the loop's forwards
    try:
        got = embed_alone(engine, "during")
        assert config.is_causal is False        # the embed neither read nor rewrote it
    finally:
        del config.is_causal
    assert off_by(got, want) <= RELATIVE_TOLERANCE, (
        f"off by {off_by(got, want):.3g}: attended bidirectionally"
    )
    assert off_by(embed_alone(engine, "after"), want) <= RELATIVE_TOLERANCE
    assert not hasattr(config, "is_causal")


def test_the_same_text_gives_the_same_vector_alone_beside_generation_and_after(engine):
    want = embed_alone(engine, "alone")
    other_want = embed_alone(engine, "other-alone", "Down the Rabbit-Hole")
    # generation first, so the embeds below run while the loop is forwarding (it reports tokens)
    gens = [req(engine, f"g{i}", text, 48 + 16 * i, sampling=Sampling(stop_at_eos=False))
            for i, text in enumerate(NEIGHBOURS)]
    engine.submit(gens)
    got, seen, deadline = {}, 0, time.monotonic() + 180
    while seen < 8:
        assert time.monotonic() < deadline, "the generation loop reported no tokens"
        progress = engine.poll(0.02)
        seen += progress.new_tokens
        got.update((r.request_id, r) for r in progress.results)
    beside = [req(engine, f"e{i}", TEXT, 0, want_hidden=True) for i in range(6)]
    beside += [req(engine, "e-gen", TEXT, 6, want_hidden=True),
               req(engine, "e-other", "Down the Rabbit-Hole", 0, want_hidden=True)]
    engine.submit(beside)
    # every request answered once, the generations included
    while len(got) < len(gens) + len(beside):
        assert time.monotonic() < deadline, (
            f"no answer for {({r.request_id for r in gens + beside}) - set(got)}"
        )
        for r in engine.poll(0.05).results:
            assert r.request_id not in got, "a request answered twice"
            got[r.request_id] = r
    assert all(
        got[g.request_id].error is None and len(got[g.request_id].output_ids) == g.max_new_tokens
        for g in gens
    )
    after = embed_alone(engine, "after")  # after prompts sharing its prefix filled the prefix cache
    errors = {
        r.request_id: off_by(
            got[r.request_id].hidden, other_want if r.request_id == "e-other" else want
        )
        for r in beside
    }
    errors["after"] = off_by(after, want)
    assert all(e <= RELATIVE_TOLERANCE for e in errors.values()), (
        f"relative distance to the text alone: {errors}"
    )


def test_a_node_embeds_one_text_the_same_alone_among_other_requests_and_after():
    """The path `llm.embed` takes: the default node (the embedded tiny model on transformers), its
    card in this process; embeds of one text alone, among generate and embed requests of other
    lengths, and after them."""
    from forge.config.load import load_node
    from forge.embedded import default_node_path
    from forge.functions.api import GenerateParams
    from forge.node.local import LocalNode

    async def main():
        node = LocalNode(load_node(default_node_path()), card_transport="thread")
        await node.start()
        try:
            alone = await node.embed("hello")
            # long generations first; once a short one has come back the loop is mid-batch,
            # forwarding
            long = [
                asyncio.ensure_future(node.generate(text, GenerateParams(max_tokens=96 + 4 * i)))
                for i, text in enumerate(NEIGHBOURS)
            ]
            await node.generate("Alice", GenerateParams(max_tokens=4))
            mixed = await asyncio.gather(
                *(
                    node.embed(text)
                    for text in ("hello", "hello there, Alice", "hello", *NEIGHBOURS, "hello")
                ),
                *(
                    node.generate(text, GenerateParams(max_tokens=8 + 4 * i))
                    for i, text in enumerate(NEIGHBOURS)
                ),
                *long,
            )
            after = [await node.embed("hello") for _ in range(2)]
            return alone, mixed[:len(NEIGHBOURS) + 4], after
        finally:
            await node.stop()

    alone, embeds, after = asyncio.run(main())
    hellos = [embeds[0], embeds[2], embeds[-1], *after]
    errors = [off_by(v, alone) for v in hellos]
    assert all(e <= RELATIVE_TOLERANCE for e in errors), (
        f"'hello' relative distance to 'hello' alone: {errors}"
    )
    assert off_by(embeds[1], alone) > 1e-3                      # another text is another vector

