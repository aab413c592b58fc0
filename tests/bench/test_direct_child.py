"""`forge bench run --direct-process child`: each direct run in a fresh process of its own (as every
forge run's card worker is), on the embedded tiny model: the same work as in the bench's process."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge_bench.modes import BenchPlan, run_modes
from forge_bench.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_direct_in_a_child_process_does_the_same_work_as_in_the_bench(tmp_path):
    pytest.importorskip("transformers")
    loaded, spec = (
        load_node(ROOT / "node_descriptions" / "local.yaml"),
        load_workload(ROOT / "bench/forge_bench/quick.yaml"),
    )
    runs = {}
    for where in ("child", "bench"):
        bp = BenchPlan(
            loaded=loaded,
            spec=spec,
            workdir=tmp_path / where,
            modes=("direct",),
            direct_variants=("longest:8",),
            records=12,
            warmup=2,
            repeat=2,
            direct_process=where,
        )
        _, runs[where] = run_modes(bp)
    child, bench = runs["child"], runs["bench"]
    assert len(child) == len(bench) == 2
    pids = set()
    for r in child:
        assert r.completed == r.requests == 12 and r.failed == 0
        own = [n for n in r.notes if n.startswith("own process (pid ")]
        assert own and r.notes[-1].startswith("repeat ")
        pids.add(int(own[0].split("pid ")[1].split(";")[0]))
    assert len(pids) == 2 and os.getpid() not in pids  # a fresh process per run, not this one
    for c, b in zip(child, bench):  # the same work on the same engine
        assert c.input_tokens == b.input_tokens and c.variant == b.variant == "longest:8"
        assert c.output_tokens > 0 and c.engine_steps and c.window_s > 0
        assert not [n for n in b.notes if n.startswith("own process")]
