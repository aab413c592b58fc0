"""Prefix reuse on the real engine matches the broker's estimate: a card of the tiny model with
`replicas: 2` (two transformers engines, one worker each) runs a job whose prompts share prefixes;
the prompt tokens the engines served from reused blocks are within 2 points of what the broker
counted as shared (forge/broker/warming.py says why they parted: requests of one prefix started
together and each computed it)."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge.functions.api import GenerateParams
from forge.node.local import LocalNode
from forge_bench.forge_mode import settled_engine_stats

FIXTURE = Path(__file__).parent / "fixtures" / "replicas-tiny.yaml"
# 4 blocks of 32 shared, 8 tokens of its own
PREFIXES, PER_PREFIX, PREFIX_TOKENS, OWN_TOKENS = 24, 8, 128, 8


def _prompts() -> list[list[int]]:
    rnd = random.Random(7)
    heads = [[rnd.randrange(100, 2000) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    out = [
        h + [rnd.randrange(100, 2000) for _ in range(OWN_TOKENS)]
        for h in heads
        for _ in range(PER_PREFIX)
    ]
    rnd.shuffle(out)
    return out


@pytest.mark.engine
def test_engines_reuse_what_the_broker_counts_on_a_card_with_two_replicas():
    async def main():
        node = LocalNode(load_node(FIXTURE))
        await node.start()
        try:
            answers = await asyncio.gather(
                *(node.generate(p, GenerateParams(max_tokens=4)) for p in _prompts())
            )
            stats = await settled_engine_stats(node)
            return answers, stats, node.broker_stats()
        finally:
            await node.stop()

    answers, stats, broker = asyncio.run(main())
    assert len(answers) == PREFIXES * PER_PREFIX
    assert {s.card for s in stats} == {"cpu0.r0", "cpu0.r1"}
    prompt = sum(s.input_tokens for s in stats)
    assert prompt == broker.prompt_tokens == PREFIXES * PER_PREFIX * (PREFIX_TOKENS + OWN_TOKENS)
    engine = sum(s.prefix_hit_tokens for s in stats) / prompt
    estimate = broker.shared_prefix_tokens / prompt
    assert abs(engine - estimate) <= 0.02, (f"engines reused {engine:.1%} of prompt tokens, "
                                            f"the broker estimated {estimate:.1%}")
