"""`forge bench run --warm-jobs K`: the forge modes run K whole jobs of other records on the node before the
measured one, outside its window, so the card worker has run work before (as the direct mode's process has) while
its prefix cache holds nothing the measured job could reuse."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from forge.bench.forge_mode import run_forge_async, write_records
from forge.bench.modes import warm_job_requests
from forge.bench.workload import generate, load_workload
from forge.config.load import load_node

ROOT = Path(__file__).resolve().parents[2]
INSTANT_NODE = ROOT / "tests" / "reliability" / "fixtures" / "nodes" / "instant.yaml"


def test_warm_job_records_share_no_prompt_or_prefix_with_the_measured_ones():
    spec = load_workload(ROOT / "docs" / "bench" / "workloads" / "cpu-mixed-short.yaml")
    measured, warm = generate(spec, 2048, 256), warm_job_requests(spec, 2048, 256)
    assert len(warm) == len(measured)
    assert not {r.prompt for r in measured} & {r.prompt for r in warm}
    length = spec.shared_prefix.length
    prefixes = lambda reqs: {r.prompt[:length] for r in reqs if r.prefix is not None}   # noqa: E731
    assert prefixes(measured) and prefixes(warm) and not prefixes(measured) & prefixes(warm)


@pytest.mark.timeout(120)
def test_warm_jobs_run_before_the_window_and_stay_out_of_its_counts(tmp_path):
    loaded = load_node(INSTANT_NODE)
    spec = load_workload(ROOT / "docs" / "bench" / "workloads" / "cpu-mixed-short.yaml")
    vocab = loaded.plans[0].contract.model.vocab_size
    reqs = generate(spec, vocab, 64)
    records = write_records(reqs, tmp_path / "records.jsonl")
    warm = write_records(warm_job_requests(spec, vocab, 64), tmp_path / "warm-records.jsonl")
    res = asyncio.run(run_forge_async(loaded, records, len(reqs), tmp_path, grouping=True, warm_jobs=2,
                                      warm_records=warm, card_transport="thread"))
    assert res.completed == res.requests == 64
    assert [n for n in res.notes if n.startswith("after 2 warm job(s) on the same node (128 records done, 0 failed")]
    # the window's counts are the measured job's alone
    assert sum(c["requests_ok"] for c in res.per_card.values()) == 64
    assert res.input_tokens == sum(len(r.prompt) for r in reqs)
    out = [json.loads(line) for line in (tmp_path / "forge.out.jsonl").read_text().splitlines()]
    assert len(out) == 64
    assert len((tmp_path / "forge.warm.out.jsonl").read_text().splitlines()) == 64
    with pytest.raises(ValueError, match="warm_records"):
        asyncio.run(run_forge_async(loaded, records, len(reqs), tmp_path, grouping=True, warm_jobs=1))
