"""Bench workloads: strict YAML, deterministic generation, the mixes honoured."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.errors import ConfigError
from forge_bench.workload import FIRST_ID, generate, load_workload, summary

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = sorted((ROOT / "docs" / "bench" / "workloads").glob("*.yaml"))

SPEC = """
workload: t
seed: 4
records: 300
input:
  - {min: 10, max: 20, weight: 3}
  - {min: 100, max: 120}
output:
  - {min: 1, max: 8}
shared_prefix: {share: 0.5, prefixes: 3, length: 40}
"""


def spec_file(tmp_path: Path, text: str = SPEC) -> Path:
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return p


def test_every_shipped_workload_loads_and_generates():
    assert WORKLOADS, "docs/bench/workloads/ holds the bench workloads"
    for path in WORKLOADS:
        spec = load_workload(path)
        reqs = generate(spec, 2048, records=min(spec.records, 50))
        assert len(reqs) == min(spec.records, 50)


def test_generation_is_deterministic_and_seeded(tmp_path):
    spec = load_workload(spec_file(tmp_path))
    a, b = generate(spec, 5000), generate(spec, 5000)
    assert a == b
    other = generate(spec.model_copy(update={"seed": 5}), 5000)
    assert [r.prompt for r in other] != [r.prompt for r in a]
    # a shorter run is a prefix of the longer one: --records N measures the first N requests of the
    # file
    assert generate(spec, 5000, records=40) == a[:40]


def test_lengths_prefixes_and_ids_follow_the_spec(tmp_path):
    spec = load_workload(spec_file(tmp_path))
    reqs = generate(spec, 5000)
    prefixes = {}
    for r in reqs:
        own = len(r.prompt) - (40 if r.prefix is not None else 0)
        assert 10 <= own <= 20 or 100 <= own <= 120
        assert 1 <= r.max_new_tokens <= 8
        assert all(FIRST_ID <= t < 5000 for t in r.prompt)
        if r.prefix is not None:
            prefixes.setdefault(r.prefix, r.prompt[:40])
            assert r.prompt[:40] == prefixes[r.prefix]
    s = summary(reqs)
    assert s["requests"] == 300 and s["distinct_prefixes"] == 3
    assert 0.4 < s["with_shared_prefix"] / 300 < 0.6           # share 0.5
    short = sum(1 for r in reqs if len(r.prompt) - (40 if r.prefix is not None else 0) <= 20)
    assert 0.65 < short / 300 < 0.85                             # weights 3:1
    assert len({r.prompt[:40] for r in reqs if r.prefix is not None}) == 3


@pytest.mark.parametrize("text, where", [
    (SPEC.replace("max: 20, weight", "maxx: 20, weight"), "$.input[0].maxx: unknown key"),
    (SPEC.replace("{min: 1, max: 8}", "{min: 9, max: 8}"), "$.output[0]: max (8) is below min (9)"),
    (SPEC.replace("records: 300", "records: 0"), "$.records:"),
    (SPEC.replace("share: 0.5", "share: 1.5"), "$.shared_prefix.share:"),
    ("- just a list", "$: a workload is a mapping"),
])
def test_bad_workloads_are_refused_naming_file_and_field(tmp_path, text, where):
    path = spec_file(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_workload(path)
    assert str(e.value).count("\n") == 0 or all("::$" in line for line in str(e.value).splitlines())
    assert f"w.yaml::{where}" in str(e.value)
