"""Pure pieces of the bench: variant parsing, tiers around a contract, ratios."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.bench.direct import parse_variants
from forge.bench.modes import ratios
from forge.bench.results import ModeResult, best
from forge.bench.sweep import around, parse_ints, tier_node
from forge.config.load import load_node
from forge.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_direct_variants():
    assert parse_variants("sorted, depth,all,depth:7", 32) == ["sorted", "depth:32", "all", "depth:7"]
    for bad in ("", "deep", "depth:0", "depth:x"):
        with pytest.raises(UsageError):
            parse_variants(bad, 32)


def test_tiers_around_a_contract_and_the_rules_they_must_keep():
    assert around(512) == [256, 512, 1024]
    assert parse_ints("2048,512, 512", "--tokens") == [512, 2048]
    with pytest.raises(UsageError):
        parse_ints("0,5", "--slots")
    loaded = load_node(ROOT / "node_descriptions" / "local.yaml")
    node, why = tier_node(loaded, "tiny-llama-cpu", 256, 16)
    assert node is None and "max_num_tokens 256 < max_input_len 384" in why
    node, why = tier_node(loaded, "tiny-llama-cpu", 1024, 8)
    assert why is None
    c = node.plans[0].contract
    assert (c.limits.max_num_tokens, c.limits.max_batch_size) == (1024, 8)
    assert c.source == loaded.plans[0].contract.source          # paths still resolve against the contract file
    assert node.plans[0].num_blocks == loaded.plans[0].num_blocks
    with pytest.raises(UsageError, match="no card running contract 'nope'"):
        tier_node(loaded, "nope", 512, 8)


def test_ratios_take_the_best_complete_run_of_each_mode():
    def r(mode, variant, tps, done=10):
        return ModeResult(mode=mode, variant=variant, requests=10, completed=done, input_tokens=tps, window_s=1.0)

    runs = [r("direct", "sorted", 900), r("direct", "depth:8", 1000), r("direct", "all", 5000, done=9),
            r("forge", "grouped", 980), r("fifo", "fifo", 700)]
    out = ratios(runs)
    assert out["best"]["direct"] == "depth:8"          # the incomplete run does not count
    assert out["forge_over_direct"] == 0.98 and out["forge_over_fifo"] == 1.4
    assert best([r("forge", "x", 5, done=3)]) is None
