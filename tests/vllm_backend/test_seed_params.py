"""What a seeded request becomes in vLLM's SamplingParams, by who draws its tokens
(forge/engines/vllm/engine.py): vLLM's own generator passes the seed on; forge's sampler sends it
greedy with its sampling in extra_args; a card with neither refuses it before it runs, in one line.
vLLM's real SamplingParams, no engine loaded."""
from __future__ import annotations

import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.engines.transformers.loading import load_tokenizer
from forge.engines.interface import REFUSED, EngineRequest, Guide, Sampling
from forge.engines.vllm import engine as vllm_engine
from forge.engines.vllm import factory, seeded

HOT = Sampling(temperature=0.8, top_p=0.9, top_k=40, seed=5)


def engine(seeds: str) -> vllm_engine.VllmEngine:
    plan = load_node(PACKAGED_NODES["local-vllm"]).plans[0]
    factory.import_vllm()  # forge's environment first, as in a card worker
    return vllm_engine.VllmEngine(
        plan,
        None,
        load_tokenizer(plan),
        vllm_engine.StepStats(plan.num_blocks),
        {},
        eos=[2],
        seeds=seeds,
    )


def params(e, sampling, guide=None):
    return e._params(EngineRequest("r", (1, 2, 3), 8, sampling, guide))


def test_vllm_draws_keep_the_seed():
    p, why = params(engine(vllm_engine.SEEDS_BY_VLLM), HOT)
    assert why is None and p.seed == 5 and p.temperature == pytest.approx(0.8) and not p.extra_args


def test_forge_draws_send_a_greedy_request_carrying_the_sampling():
    e = engine(vllm_engine.SEEDS_BY_FORGE)
    p, why = params(e, HOT)
    assert why is None and p.seed is None and p.temperature == 0.0
    assert p.extra_args == {
        seeded.EXTRA_KEY: {"seed": 5, "temperature": 0.8, "top_p": 0.9, "top_k": 40}
    }
    p, _ = params(e, HOT, Guide(choice=("yes", "no")))  # the choice guide's key stays beside it
    assert set(p.extra_args) == {"forge_choice", seeded.EXTRA_KEY}
    p, _ = params(e, Sampling(temperature=0.8))  # no seed: vLLM samples it as asked
    assert p.temperature == pytest.approx(0.8) and not p.extra_args


def test_a_card_that_cannot_honour_a_seed_refuses_it_up_front():
    e = engine(vllm_engine.SEEDS_REFUSED)
    p, why = params(e, HOT)
    assert p is None and why == vllm_engine.SEED_REFUSAL
    # greedy: the seed changes nothing
    assert params(e, Sampling(temperature=0.0, seed=5))[1] is None
    e.submit([EngineRequest("r", (1, 2, 3), 8, HOT)])
    (result,) = e.poll(0).results
    assert (
        result.finish_reason == REFUSED and "leave seed unset or use temperature 0" in result.error
    )
