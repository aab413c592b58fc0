"""A forge-mode bench run whose only engine dies says why in the run's notes (a sweep candidate's
reason then names the cause, e.g. an engine's CUDA out-of-memory, rather than only "completed 0 of
N")."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge_bench.forge_mode import run_forge_async, write_records
from forge_bench.workload import BenchRequest

CRASH_NODE = Path(__file__).parents[1] / "reliability" / "fixtures" / "nodes" / "crash.yaml"


@pytest.mark.timeout(120)
def test_a_run_that_loses_every_engine_names_the_cause(tmp_path):
    loaded = load_node(CRASH_NODE)  # instant engine, injected crash after exactly 300 results
    reqs = [BenchRequest(index=i, prompt=tuple(range(1, 9)), max_new_tokens=2) for i in range(400)]
    records = write_records(reqs, tmp_path / "records.jsonl")
    res = asyncio.run(run_forge_async(loaded, records, len(reqs), tmp_path, grouping=True))
    assert res.completed == 300 and res.completed < res.requests
    down = [n for n in res.notes if "no engine can work" in n]
    assert len(down) == 1 and "engine failed: injected crash after 300 results" in down[0], (
        res.notes
    )
    assert len(down[0]) <= 400 and "\n" not in down[0]
