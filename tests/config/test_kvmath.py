"""KV-cache arithmetic and the per-card plan (pure functions)."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from forge.config import kvmath
from forge.config.models import Card, Contract
from forge.config.plan import plan_card, plan_node
from forge.config.units import GIB
from tests.config.conftest import trt_contract

GPU32 = Card.model_validate(
    {
        "index": 0,
        "kind": "gpu",
        "model": "NVIDIA GeForce RTX 5090",
        "memory_gib": 32,
        "compute_capability": "12.0",
        "engine": "t1k",
    }
)


def test_bytes_per_token_is_k_and_v_for_every_layer():
    assert kvmath.kv_bytes_per_token(32, 8, 128, "fp8") == 2 * 32 * 8 * 128 == 65536
    assert kvmath.kv_bytes_per_token(32, 8, 128, "bf16") == 131072
    assert kvmath.kv_bytes_per_token(32, 8, 128, "bf16", tp_size=2) == 65536
    assert kvmath.kv_bytes_per_token(4, 4, 32, "fp32") == 4096          # the embedded tiny model


def test_blocks_round_up():
    assert kvmath.blocks_for(1152, 32) == 36
    assert kvmath.blocks_for(3968, 128) == 31
    assert [kvmath.blocks_for(n, 32) for n in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]


def test_pool_from_max_tokens_is_whole_blocks():
    kw = dict(card_memory_bytes=32 * GIB, weights_bytes=0, bytes_per_token=1, tokens_per_block=32,
              free_gpu_memory_fraction=None)
    assert kvmath.pool_tokens(max_tokens=1000, **kw) == 992
    assert kvmath.pool_tokens(max_tokens=1024, **kw) == 1024


def test_pool_from_fraction_applies_to_memory_after_weights():
    tokens = kvmath.pool_tokens(
        card_memory_bytes=32 * GIB,
        weights_bytes=kvmath.gib(7.2),
        bytes_per_token=65536,
        tokens_per_block=32,
        free_gpu_memory_fraction=0.85,
        max_tokens=None,
    )
    expected = int((32 * GIB - kvmath.gib(7.2)) * 0.85) // 65536 // 32 * 32
    assert tokens == expected == 345344


def test_weights_larger_than_the_card_leave_no_pool():
    assert (
        kvmath.pool_tokens(
            card_memory_bytes=6 * GIB,
            weights_bytes=kvmath.gib(7.2),
            bytes_per_token=65536,
            tokens_per_block=32,
            free_gpu_memory_fraction=0.9,
            max_tokens=None,
        )
        == 0
    )


def test_plan_of_the_standard_tier_on_a_32gb_card():
    p = plan_card(GPU32, Contract.model_validate(trt_contract()))
    assert (p.num_blocks, p.blocks_per_full_seq, p.full_length_slots) == (10792, 36, 299)
    assert p.kv_pool_bytes == p.kv_pool_tokens * 65536
    assert p.token_budget == 8192 and p.slots == 256 and p.effective_slots == 256
    assert p.fits_memory and p.card_id == "gpu0"


def test_plan_reports_the_real_number_of_full_length_slots():
    card16 = GPU32.model_copy(update={"memory_gib": 16.0})
    p = plan_card(card16, Contract.model_validate(trt_contract()))
    assert p.full_length_slots == 106 and p.effective_slots == 106


def test_plan_node_needs_every_contract():
    import pytest

    from forge.config.models import NodeDescription
    from forge.errors import ForgeError
    from tests.config.conftest import node

    n = NodeDescription.model_validate(node())
    assert [p.card_id for p in plan_node(n, {"t1k": Contract.model_validate(trt_contract())})] == [
        "gpu0"
    ]
    with pytest.raises(ForgeError, match="no contract named t1k"):
        plan_node(n, {})


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 128),
    kv_heads=st.integers(1, 64),
    head_dim=st.sampled_from([32, 64, 128, 256]),
    kv=st.sampled_from(sorted(kvmath.KV_DTYPE_BYTES)),
    tpb=st.sampled_from([8, 16, 32, 64, 128, 256]),
    card_gib=st.integers(1, 192),
    weights_gib=st.floats(0, 200),
    fraction=st.floats(0.01, 1.0),
    seq=st.integers(1, 65536),
)
def test_plan_invariants(layers, kv_heads, head_dim, kv, tpb, card_gib, weights_gib, fraction, seq):
    bpt = kvmath.kv_bytes_per_token(layers, kv_heads, head_dim, kv)
    weights = kvmath.gib(weights_gib)
    tokens = kvmath.pool_tokens(
        card_memory_bytes=card_gib * GIB,
        weights_bytes=weights,
        bytes_per_token=bpt,
        tokens_per_block=tpb,
        free_gpu_memory_fraction=fraction,
        max_tokens=None,
    )
    assert tokens >= 0 and tokens % tpb == 0
    if weights <= card_gib * GIB:                 # a fraction never sizes the pool past the card
        assert weights + tokens * bpt <= card_gib * GIB
    per_seq = kvmath.blocks_for(seq, tpb)
    assert per_seq * tpb >= seq > (per_seq - 1) * tpb
    slots = (tokens // tpb) // per_seq
    assert slots * per_seq <= tokens // tpb < (slots + 1) * per_seq


def test_replicas_share_the_memory_left_after_every_copy_of_the_weights():
    kw = dict(
        card_memory_bytes=32 * GIB,
        weights_bytes=kvmath.gib(7.2),
        bytes_per_token=65536,
        tokens_per_block=32,
        free_gpu_memory_fraction=0.85,
        max_tokens=None,
    )
    one, two = kvmath.pool_tokens(**kw), kvmath.pool_tokens(replicas=2, **kw)
    assert two == int((32 * GIB - 2 * kvmath.gib(7.2)) // 2 * 0.85) // 65536 // 32 * 32 == 122528
    assert two < one // 2                             # the second copy of the weights is paid for
    assert kvmath.pool_tokens(replicas=5, **kw) == 0  # 5 x 7.2 GiB of weights leave nothing
    assert (
        kvmath.pool_tokens(**dict(kw, free_gpu_memory_fraction=None, max_tokens=4096), replicas=3)
        == 4096
    )


def test_plan_of_a_card_with_replicas_and_its_engines():
    from forge.config.plan import engine_plans, one_engine, replica_plans

    card = GPU32.model_copy(update={"replicas": 2})
    p = plan_card(card, Contract.model_validate(trt_contract()))
    assert (p.replicas, p.replica, p.num_blocks, p.full_length_slots) == (2, None, 3829, 106)
    assert p.card_bytes == 2 * (p.weights_bytes + p.kv_pool_bytes) and p.fits_memory
    assert p.engine_id == "gpu0" and "replicas: 2" in one_engine(p)
    reps = replica_plans(p)
    assert [r.engine_id for r in reps] == ["gpu0.r0", "gpu0.r1"] and [r.replica for r in reps] == [
        0,
        1,
    ]
    assert all(
        r.num_blocks == p.num_blocks and r.card_id == "gpu0" and one_engine(r) is None for r in reps
    )
    single = plan_card(GPU32, Contract.model_validate(trt_contract()))
    assert [r.engine_id for r in engine_plans([single, p])] == ["gpu0", "gpu0.r0", "gpu0.r1"]
    assert one_engine(single) is None
    five = plan_card(
        GPU32.model_copy(update={"replicas": 5}), Contract.model_validate(trt_contract())
    )
    # 5 x 7.2 GiB leave no KV: validation refuses
    assert five.num_blocks == 0 and not five.fits_memory
