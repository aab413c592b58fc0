"""`forge run --node local-vllm` from any folder: the real CLI, the real card worker and vLLM CPU
engine, the embedded model. Greedy generation, guided choice and JSON, seeds (same seed -> same
text, different seeds differ at temperature 1), and the report's engine counters (no preemption)."""
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
TEXTS = ["Alice was beginning to get very tired", "The Queen of Hearts", "Down the rabbit hole",
         "The Mock Turtle sighed deeply"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    records = []
    for i, text in enumerate(TEXTS * 4):
        kind = ("plain", "choice", "json", "seeded")[i // len(TEXTS)]
        records.append({"id": i, "kind": kind, "text": text, "seed": 11 if i % 2 else 12})
    # record 12's text, another seed
    records.append({"id": 100, "kind": "seeded", "text": TEXTS[0], "seed": 11})
    # record 13's text and seed
    records.append({"id": 101, "kind": "seeded", "text": TEXTS[1], "seed": 11})
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_LOAD_PLUGINS": "",
        "FORGE_HOME": str(tmp / "home"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            str(FIXTURES / "kinds.py"),
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
    rows = {}
    if out.exists():
        rows = {
            r["result"]["id"]: r["result"]
            for r in map(json.loads, out.read_text().splitlines())
            if "result" in r
        }
    return proc, rows, out


def test_the_job_completes_on_the_vllm_card(job):
    proc, rows, _ = job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert len(rows) == 18 and {r["card"] for r in rows.values()} == {"cpu0"}
    assert "kinds on local-vllm: 18 done, 0 failed" in proc.stderr


def test_greedy_generation(job):
    _, rows, _ = job
    plain = [rows[i] for i in range(4)]
    assert all(0 < r["tokens"] <= 16 and r["finish"] in ("length", "eos") for r in plain)
    assert all(r["text"].strip() for r in plain)


def test_guided_choice_and_json(job):
    from tests.vllm_backend.fixtures.kinds import SCHEMA

    _, rows, _ = job
    assert {rows[i]["text"] for i in range(4, 8)} <= {"yes", "no", "maybe"}
    for i in range(8, 12):
        jsonschema.validate(json.loads(rows[i]["text"]), SCHEMA)


def test_seeds(job):
    _, rows, _ = job
    assert rows[13]["text"] == rows[101]["text"]          # one text, one seed: one answer
    assert rows[12]["text"] != rows[100]["text"]  # one text, seeds 12 and 11 differ


def test_the_report_counts_the_engine_and_no_preemption(job):
    _, _, out = job
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    (card,) = report["cards"]
    assert (
        card["tier"] == "tiny-llama-vllm" and card["engine_steps"] > 0 and card["output_tokens"] > 0
    )
    assert card["preemptions"] == 0


def test_vllm_logs_to_the_cards_file_and_the_console_keeps_forges_lines(job):
    """vLLM's and torch's lines (its config dump, LD_PRELOAD and Triton advice, NUMA binding,
    deprecations, the weights' progress bar) go to $FORGE_HOME/logs/local-vllm/cpu0.log, said once;
    the console has forge's lines."""
    proc, _, out = job
    log = out.parent / "home" / "logs" / "local-vllm" / "cpu0.log"
    text = log.read_text()
    for line in ("vllm.v1.engine.core: Initializing a V1 LLM engine", "Loading safetensors "
                                                                      "checkpoint shards",
                 "libtcmalloc is not found in LD_PRELOAD"):
        assert line in text, text[-3000:]
    assert proc.stderr.count(f"forge: card cpu0: its engine library logs to {log}\n") == 1, (
        proc.stderr
    )
    for line in proc.stderr.splitlines():
        assert line.startswith("forge: "), proc.stderr  # forge's lines only (--progress off)
    for vllm_line in (
        "Initializing a V1 LLM engine",
        "LD_PRELOAD",
        "Triton",
        "NUMA",
        "Loading safetensors",
        "deprecated",
        "INFO",
        "WARNING",
    ):
        assert vllm_line not in proc.stderr, proc.stderr
