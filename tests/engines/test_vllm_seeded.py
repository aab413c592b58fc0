"""forge's seeded draw for vLLM's CPU card (forge/engines/vllm/seeded.py), as pure functions over
torch tensors: which tokens temperature / top-k / top-p leave, and that a draw depends on (seed,
position) only."""
from __future__ import annotations

import math

import pytest

from forge.engines.interface import Sampling
from forge.engines.vllm import seeded
from tests.installed import skip_module_unless_installed

skip_module_unless_installed("torch")


@pytest.fixture
def logits():
    import torch          # here, not at collection: plain `pytest` collects without importing torch

    return torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))


def spec(seed=7, temperature=1.0, top_p=1.0, top_k=0):
    return seeded.extra_args(
        Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    )[seeded.EXTRA_KEY]


def kept(scores) -> list[int]:
    return [i for i, v in enumerate(scores.tolist()) if not math.isinf(v)]


def test_top_k_and_top_p_leave_the_most_likely_tokens(logits):
    import torch

    assert kept(seeded.shaped_logits(logits, 1.0, 2, 1.0)) == [0, 1]
    assert kept(seeded.shaped_logits(logits, 1.0, 0, 0.7)) == [0, 1]          # 0.5 < 0.7 <= 0.75
    assert kept(seeded.shaped_logits(logits, 1.0, 0, 0.75)) == [0, 1]
    assert kept(seeded.shaped_logits(logits, 1.0, 0, 0.76)) == [0, 1, 2]
    # the most likely token always stays
    assert kept(seeded.shaped_logits(logits, 1.0, 0, 0.01)) == [0]
    scaled = seeded.shaped_logits(logits, 0.5, 0, 1.0)
    assert torch.allclose(scaled, logits * 2)


def test_a_draw_depends_on_seed_and_position_only(logits):
    first = [seeded.draw(logits, spec(seed=7), p) for p in range(64)]
    assert first == [seeded.draw(logits.clone(), spec(seed=7), p) for p in range(64)]
    assert first != [seeded.draw(logits, spec(seed=8), p) for p in range(64)]
    assert len(set(first)) > 1  # it samples, not argmax
    assert {seeded.draw(logits, spec(top_k=2), p) for p in range(64)} == {0, 1}


def test_only_sampled_requests_with_a_seed_are_drawn_by_forge():
    assert seeded.wanted(Sampling(temperature=0.8, seed=3))
    assert not seeded.wanted(Sampling(temperature=0.8))
    assert not seeded.wanted(Sampling(temperature=0.0, seed=3))
    assert not seeded.wanted(Sampling(temperature=0.8, top_k=1, seed=3))
    assert seeded.draw_seed(1, 23) != seeded.draw_seed(12, 3)
