"""`forge bench run --repeat N`: the modes alternate their order from one repeat to the next, so a
machine that drifts over the invocation does not always favour the mode that runs first."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.config.load import load_node
from forge_bench.modes import BenchPlan, ratios, repeat_order, run_modes
from forge_bench.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
INSTANT_NODE = ROOT / "tests" / "reliability" / "fixtures" / "nodes" / "instant.yaml"
WORKLOAD = ROOT / "docs" / "bench" / "workloads" / "cpu-mixed-short.yaml"


def test_every_other_repeat_runs_the_modes_in_reverse():
    assert repeat_order(("direct", "forge"), 0) == ["direct", "forge"]
    assert repeat_order(("direct", "forge"), 1) == ["forge", "direct"]
    assert repeat_order(("direct", "forge", "fifo"), 2) == ["direct", "forge", "fifo"]
    assert repeat_order(("direct", "forge", "fifo"), 3) == ["fifo", "forge", "direct"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_repeated_bench_alternates_the_order_of_its_runs(tmp_path):
    bp = BenchPlan(loaded=load_node(INSTANT_NODE), spec=load_workload(WORKLOAD), workdir=tmp_path,
                   modes=("forge", "fifo"), records=16, warmup=2, repeat=3, card_transport="thread")
    _, results = run_modes(bp)
    assert [(r.mode, r.notes[-1]) for r in results] == [
        ("forge", "repeat 1"), ("fifo", "repeat 1"), ("fifo", "repeat 2"), ("forge", "repeat 2"),
        ("forge", "repeat 3"), ("fifo", "repeat 3")]
    assert all(r.completed == r.requests == 16 for r in results)
    assert [r.started_at for r in results] == sorted(r.started_at for r in results)
    # each repeat's own ratio beside the best-of ratio (what "none below X" targets are stated in)
    per = ratios(results)["per_repeat"]
    assert [row["repeat"] for row in per] == [1, 2, 3]
    for row, pair in zip(per, (results[0:2], results[2:4], results[4:6])):
        forge, fifo = sorted(pair, key=lambda r: r.mode != "forge")
        assert row["forge_over_fifo"] == round(forge.tokens_per_s / fifo.tokens_per_s, 4)
        assert row["forge_over_direct"] is None
