"""Seeded sampling at volume through `forge run --node local-vllm` (issue 49): 64 sampled requests
with seeds and 60-80 token prompts, more than one step's token budget (512), so vLLM splits a prompt
across steps. vLLM's own per-request generator cannot be wound back on the CPU (`RuntimeError: CPU
Generator does not use offset`, the card lost); forge draws seeded tokens itself there
(forge/engines/vllm/seeded.py), among the tokens a guide allows. The job runs twice, the second time
in reverse order (other batches, other chunks): every record gets the same text both times."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORDS = ("Alice was beginning to get very tired of sitting by her sister on the bank and of having "
         "nothing to do "
         "once or twice she had peeped into the book her sister was reading").split()
RECORDS = 80
GUIDED = range(64, 80)          # 64-71 a seeded choice, 72-79 a seeded JSON object


def records() -> list[dict]:
    """Records 0-31: distinct prompts, seeds 1000-1003; 32-47 repeat 0-15's prompt and seed; 48-63
    repeat 0-15's prompt with another seed; 64-79 guided, sampled with seeds."""
    out = []
    for i in range(32):
        text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(60 + i % 20))
        out.append({"id": i, "seed": 1000 + i % 4, "text": text})
    out += [{**out[i], "id": 32 + i} for i in range(16)]
    out += [{**out[i], "id": 48 + i, "seed": 2000 + i} for i in range(16)]
    out += [{**out[i], "id": 64 + i, "kind": "choice"} for i in range(8)]
    out += [{**out[i], "id": 72 + i, "kind": "json"} for i in range(8)]
    return out


def run(tmp: Path, name: str, rows: list[dict]) -> tuple[subprocess.CompletedProcess, dict]:
    inp, out = tmp / f"{name}.jsonl", tmp / f"{name}.out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_LOAD_PLUGINS": "",
        "FORGE_HOME": str(tmp / f"home-{name}"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            str(FIXTURES / "seeded.py"),
            "--node",
            "local-vllm",
            "--input",
            str(inp),
            "--output",
            str(out),
            "--progress",
            "off",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    results = {}
    if out.exists():
        results = {
            r["result"]["id"]: r["result"]
            for r in map(json.loads, out.read_text().splitlines())
            if "result" in r
        }
    return proc, results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seeded")
    return run(tmp, "forward", records()), run(tmp, "reverse", records()[::-1])


def test_seeded_requests_at_volume_complete_on_the_vllm_card(runs):
    for proc, results in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "does not use offset" not in proc.stderr and "Traceback" not in proc.stderr
        assert f"seeded on local-vllm: {RECORDS} done, 0 failed" in proc.stderr, proc.stderr[-2000:]
        assert sorted(results) == list(range(RECORDS))
        assert all(r["tokens"] > 0 for r in results.values())


def test_the_same_seed_gives_the_same_text(runs):
    (_, forward), (_, reverse) = runs
    # one run, other batches
    assert all(forward[i]["text"] == forward[32 + i]["text"] for i in range(16))
    assert {i: r["text"] for i, r in forward.items()} == {i: r["text"] for i, r in reverse.items()}


def test_a_seeded_guided_answer_keeps_its_guide(runs):
    from tests.vllm_backend.fixtures.seeded import CHOICES, SCHEMA

    for _, results in runs:
        assert all(results[i]["text"] in CHOICES for i in GUIDED[:8])
        for i in GUIDED[8:]:
            jsonschema.validate(json.loads(results[i]["text"]), SCHEMA)


def test_another_seed_samples_another_text(runs):
    (_, forward), _ = runs
    differ = sum(forward[i]["text"] != forward[48 + i]["text"] for i in range(16))
    assert differ >= 8, f"only {differ} of 16 prompts sampled another text with another seed"
