"""What forge refuses around vLLM, with the real engine: a card whose engine vLLM built differently
from the contract (the read-back), and what forge's admission keeps from happening: bare vLLM
preempts on a job whose worst case does not fit its KV pool; the same job through forge (same engine
arguments) never does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from forge.embedded import HERE as EMBEDDED

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def env(tmp: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_LOAD_PLUGINS": "",
        "FORGE_HOME": str(tmp / "home"),
        "PYTHONUNBUFFERED": "1",
    }


def test_the_read_back_refuses_a_card_vllm_built_differently(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(FIXTURES / "read_back.py")],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(("REFUSED", "BUILT"))]
    assert line == (
        "REFUSED "
        + str(EMBEDDED / "tiny-llama-vllm.yaml")
        + "::$.kv_cache.max_tokens: contract 512 "
        "blocks of 32 tokens (16384 tokens), vLLM built 256 "
        "(cache_config.num_gpu_blocks); the card is "
        "refused"
    ), proc.stdout + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory) -> Path:
    """The embedded vLLM tier with a 32-block (1,024-token) pool: 3 sequences of 200 + 128 tokens
    (11 blocks) at once; bare vLLM admits by prompt (7 blocks) and so takes 4, then preempts as
    their outputs grow."""
    tmp = tmp_path_factory.mktemp("small")
    contract = yaml.safe_load((EMBEDDED / "tiny-llama-vllm.yaml").read_text())
    contract["contract"] = "tiny-llama-vllm-small"
    contract["artifact"]["checkpoint"] = str(EMBEDDED / "tiny-llama")
    contract["kv_cache"]["max_tokens"] = 1024
    contract["limits"].update(max_input_len=256, max_output_len=128, max_num_tokens=512)
    (tmp / "small.yaml").write_text(yaml.safe_dump(contract))
    node = yaml.safe_load((EMBEDDED / "local-vllm.yaml").read_text())
    node.update(node="small-vllm", contracts="small.yaml")
    node["cards"][0]["engine"] = "tiny-llama-vllm-small"
    (tmp / "node.yaml").write_text(yaml.safe_dump(node))
    return tmp


def test_bare_vllm_preempts_on_the_job(small_pool):
    proc = subprocess.run(
        [
            sys.executable,
            str(FIXTURES / "bare_vllm.py"),
            str(small_pool / "node.yaml"),
            "200",
            "12",
            "128",
        ],
        cwd=small_pool,
        env=env(small_pool),
        capture_output=True,
        text=True,
        timeout=300,
    )
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    got = json.loads(line)
    assert got["num_blocks"] == 32 and got["finished"] == 12 and got["tokens"] == 12 * 128
    assert got["preemptions"] > 0, got


def test_forge_never_preempts_on_the_same_job(small_pool):
    records = small_pool / "in.jsonl"
    records.write_text(
        "".join(
            json.dumps({"id": i, "ids": [1] + [(7 * i + 13 * j) % 1900 + 50 for j in range(199)]})
            + "\n"
            for i in range(12)
        )
    )
    out = small_pool / "out.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            str(FIXTURES / "long_ids.py"),
            "--node",
            str(small_pool / "node.yaml"),
            "--input",
            str(records),
            "--output",
            str(out),
            "--progress",
            "off",
        ],
        cwd=small_pool,
        env=env(small_pool),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (card,) = json.loads(out.with_name(out.name + ".report.json").read_text())["cards"]
    assert card["requests"]["ok"] == 12 and card["output_tokens"] > 0
    assert card["preemptions"] == 0, card
