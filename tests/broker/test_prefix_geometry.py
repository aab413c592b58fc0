"""Prefix hashes, bounded memories, buckets and fit checks (hypothesis where a property says it
best)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.broker import BrokerCore
from forge.broker.geometry import FitTable, LengthBuckets, grouping_view
from forge.prefix_blocks import BlockMirror, BoundedLRU, chain_hashes

from .helpers import fits, geom, req

tokens = st.lists(st.integers(0, 3), max_size=40).map(tuple)  # tiny alphabet: many shared prefixes


@settings(max_examples=300, deadline=None)
@given(a=tokens, b=tokens, tpb=st.sampled_from([1, 2, 4, 8]))
def test_chain_hashes_agree_exactly_on_shared_full_blocks(a, b, tpb):
    ha, hb = chain_hashes(a, tpb), chain_hashes(b, tpb)
    assert len(ha) == len(a) // tpb
    shared_blocks = 0
    while (shared_blocks + 1) * tpb <= min(len(a), len(b)) and a[
        shared_blocks * tpb : (shared_blocks + 1) * tpb
    ] == b[shared_blocks * tpb : (shared_blocks + 1) * tpb]:
        shared_blocks += 1
    common = 0
    while common < min(len(ha), len(hb)) and ha[common] == hb[common]:
        common += 1
    assert common == shared_blocks
    assert chain_hashes(a, tpb, limit=2) == ha[:2]


def test_same_tokens_in_other_block_sizes_do_not_share_keys():
    t = tuple(range(16))
    assert chain_hashes(t, 8)[0] != chain_hashes(t, 16)[0]


@given(
    ops=st.lists(st.tuples(st.integers(0, 20), st.integers()), max_size=200), cap=st.integers(1, 8)
)
def test_bounded_lru_never_exceeds_capacity_and_keeps_the_latest(ops, cap):
    lru = BoundedLRU(cap)
    for k, v in ops:
        lru.put(k, v)
        assert len(lru) <= cap and lru.get(k) == v


def test_block_mirror_counts_leading_blocks_and_forgets_oldest():
    m = BlockMirror(4)
    assert m.dispatch([1, 2, 3]) == 0
    assert m.dispatch([1, 2, 9]) == 2          # leading blocks only
    assert m.dispatch([5, 1, 2]) == 0          # not a prefix match
    assert len(m) == 4                          # 1, 2, 3, 9, 5 -> the oldest (3) is gone
    assert m.dispatch([1, 2, 3]) == 2


def test_length_buckets_default_powers_of_two_and_custom():
    b = LengthBuckets(384)
    assert b.bounds == [16, 32, 64, 128, 256, 512]
    assert [b.index(n) for n in (0, 16, 17, 384)] == [0, 0, 1, 5]
    assert b.labels[1] == "<=32" and b.lower[1] == 17
    c = LengthBuckets(100, boundaries=[50, 10])
    assert c.bounds == [10, 50, 100] and c.index(1000) == 2
    with pytest.raises(ValueError):
        LengthBuckets(100, boundaries=[0])


def test_grouping_view_is_the_common_tokenizer_and_its_largest_block():
    engines = [geom("a", tok="x", tpb=16), geom("b", tok="y", tpb=64), geom("c", tok="x", tpb=32)]
    assert grouping_view(engines) == ("x", 32)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 600), new=st.integers(0, 200), tpb=st.sampled_from([8, 16, 64]),
       max_in=st.integers(1, 500), max_out=st.integers(1, 150), kv=st.integers(1, 60))
def test_fit_mask_matches_the_plain_rule(n, new, tpb, max_in, max_out, kv):
    engines = [
        geom("a", tpb=tpb, max_in=max_in, max_out=max_out, kv=kv),
        geom("b"),
        geom("c", tok="u"),
    ]
    r = req(range(n), max_new=new)
    mask = FitTable(engines).mask(r)
    assert [bool(mask >> i & 1) for i in range(3)] == [fits(r, g) for g in engines]


def test_engine_geometry_refuses_nonsense():
    with pytest.raises(ValueError, match="max_num_tokens must be a positive int"):
        geom(budget=0)


def test_core_refuses_duplicate_engine_ids_and_no_engines():
    with pytest.raises(ValueError, match="unique"):
        BrokerCore([geom("a"), geom("a")])
    with pytest.raises(ValueError, match="at least one"):
        BrokerCore([])


def test_request_prompts_become_tuples():
    r = req([1, 2, 3])
    r2 = type(r)(request_id="z", prompts={"t": [1, 2]}, max_new_tokens=1)
    assert r2.prompts["t"] == (1, 2)
    with pytest.raises(KeyError, match="no prompt for tokenizer 'q'"):
        r.prompt_for("q")
