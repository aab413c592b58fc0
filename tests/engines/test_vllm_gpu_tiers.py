"""The vLLM GPU tiers (docs/bench/gpu-vllm/) and the share of a card vLLM is told it may take: pure
mapping, no vLLM."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge.config.plan import engine_plans, plan_card
from forge.engines.vllm import mapping

TIERS = Path(__file__).resolve().parents[2] / "docs" / "bench" / "gpu-vllm"
CARDS = {"h100": 79.0, "h200": 140.0}
GEOMETRY = {"1p5b": (16, 64, 2.79), "8b": (32, 128, 14.96)}  # layers, head_dim, weights GiB (bf16)


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("model", sorted(GEOMETRY))
def test_each_gpu_tier_maps_to_stated_cuda_arguments(card, model):
    loaded = load_node(TIERS / f"node-{card}-llama-{model}-vllm.yaml")
    plan = loaded.plans[0]
    c = plan.contract
    args = mapping.engine_arguments(c, plan)
    layers, head_dim, weights = GEOMETRY[model]
    # the geometry the bench made it from
    config = json.loads((Path(args["model"]) / "config.json").read_text())
    assert (config["num_hidden_layers"], config.get("head_dim"), config["num_key_value_heads"]) == (
        layers,
        head_dim,
        8,
    )
    assert (c.model.num_layers, c.model.head_dim, c.model.weights_gib) == (
        layers,
        head_dim,
        weights,
    )
    assert (args["load_format"], args["dtype"], args["kv_cache_dtype"]) == (
        "dummy",
        "bfloat16",
        "auto",
    )
    assert (args["attention_backend"], args["enforce_eager"], args["async_scheduling"]) == (
        "FLASH_ATTN",
        False,
        True,
    )
    assert plan.card_memory_bytes == int(CARDS[card] * 2**30) and plan.fits_memory
    # bf16 KV: 2 (K and V) x layers x 8 heads x head_dim x 2 bytes per token, 294,912 tokens in
    # blocks of 64
    assert args["kv_cache_memory_bytes"] == 294912 * 2 * layers * 8 * head_dim * 2
    assert args["num_gpu_blocks_override"] == 294912 // 64 == plan.num_blocks
    share = (plan.weights_bytes + plan.kv_pool_bytes) / plan.card_memory_bytes
    assert share <= args["gpu_memory_utilization"] < share + 0.001
    assert mapping.problems(c) == []


def test_the_share_is_one_engines_plan_so_replicas_and_shared_cards_start():
    # vLLM refuses to start unless gpu_memory_utilization x total is free, even when
    # kv_cache_memory_bytes sizes the pool: with the fixed 0.92 a second replica on the card could
    # never start.
    loaded = load_node(TIERS / "node-h100-llama-1p5b-vllm.yaml")
    card = loaded.plans[0].card.model_copy(update={"replicas": 3})
    three = plan_card(card, loaded.plans[0].contract)
    engines = engine_plans([three])
    shares = [mapping.engine_arguments(p.contract, p)["gpu_memory_utilization"] for p in engines]
    assert len(shares) == 3 and len(set(shares)) == 1
    per_engine = (three.weights_bytes + three.kv_pool_bytes) / three.card_memory_bytes
    assert shares[0] == math.ceil(per_engine * 1000) / 1000
    # what is left once the others hold their plan is at least what the last one asks to be free
    left = three.card_memory_bytes - 2 * (three.weights_bytes + three.kv_pool_bytes)
    assert left >= (shares[0] - 0.001) * three.card_memory_bytes
    assert 3 * shares[0] < 1.0


def test_the_share_never_leaves_vllms_range():
    loaded = load_node(TIERS / "node-h100-llama-8b-vllm.yaml")
    plan = loaded.plans[0]
    tiny = dataclasses.replace(plan, kv_pool_bytes=0, weights_bytes=1)
    full = dataclasses.replace(plan, kv_pool_bytes=plan.card_memory_bytes)
    assert mapping.gpu_memory_utilization(tiny) == 0.001
    assert mapping.gpu_memory_utilization(full) == 1.0
