"""Pure pieces of the bench: variant parsing, ratios (the sweep's are in test_sweep_units.py)."""
from __future__ import annotations

import pytest

from forge.errors import UsageError
from forge_bench.direct import parse_variants
from forge_bench.modes import ratios
from forge_bench.results import ModeResult, best


def test_direct_variants():
    assert parse_variants("sorted, depth,all,depth:7", 32) == [
        "sorted",
        "depth:32",
        "all",
        "depth:7",
    ]
    assert parse_variants("longest,longest:9", 32) == ["longest:32", "longest:9"]
    for bad in ("", "deep", "depth:0", "depth:x", "longest:0", "longest:"):
        with pytest.raises(UsageError):
            parse_variants(bad, 32)


def test_ratios_take_the_best_complete_run_of_each_mode():
    def r(mode, variant, tps, done=10):
        return ModeResult(
            mode=mode, variant=variant, requests=10, completed=done, input_tokens=tps, window_s=1.0
        )

    runs = [
        r("direct", "sorted", 900),
        r("direct", "depth:8", 1000),
        r("direct", "all", 5000, done=9),
        r("forge", "grouped", 980),
        r("fifo", "fifo", 700),
    ]
    out = ratios(runs)
    assert out["best"]["direct"] == "depth:8"          # the incomplete run does not count
    assert out["forge_over_direct"] == 0.98 and out["forge_over_fifo"] == 1.4
    assert best([r("forge", "x", 5, done=3)]) is None
