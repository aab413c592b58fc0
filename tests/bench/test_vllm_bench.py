"""`forge bench run --modes direct` and `forge bench sweep` on a vLLM card, as a user runs them: the
embedded tiny model on vLLM's CPU engine (enforce_eager), each command a real child process. The
direct mode builds vllm.LLM from forge's own mapping of the contract (the engine it built is read
back into the report); the sweep explores the vllm backend's tunables and writes a winner `forge
validate` accepts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.engine
skip_module_unless_installed("vllm")

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "bench" / "forge_bench" / "quick.yaml"


def forge(*args, timeout):
    return subprocess.run(
        [sys.executable, "-m", "forge", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(300)
def test_direct_mode_drives_vllm_with_the_contracts_engine_arguments(tmp_path):
    proc = forge(
        "bench",
        "run",
        "--node",
        "local-vllm",
        "--modes",
        "direct",
        "--direct",
        "all,depth:4",
        "--records",
        8,
        "--warmup",
        1,
        "--out",
        tmp_path / "b",
        QUICK,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((tmp_path / "b" / "bench.json").read_text())["results"]
    assert [(r["mode"], r["variant"]) for r in runs] == [("direct", "all"), ("direct", "depth:4")]
    for r in runs:
        assert r["completed"] == r["requests"] == 8 and r["failed"] == 0
        # the embedded vllm contract: budget 512, 32 slots, 384 + 128 tokens, 512 blocks of 32,
        # prefix caching
        assert ("engine built: max_num_batched_tokens 512, max_num_seqs 32, max_model_len 512, "
                "block_size 32, "
                "num_gpu_blocks 512, enable_prefix_caching True") in r["notes"]
        # vLLM: a token a step each
        assert r["engine_steps"] >= r["output_tokens"] / 8 and r["ms_per_step"] > 0
    # greedy: the same tokens either way
    assert runs[0]["output_tokens"] == runs[1]["output_tokens"] > 0
    assert runs[0]["input_tokens"] == runs[1]["input_tokens"]


@pytest.mark.timeout(420)
def test_sweep_explores_vllm_tunables_and_writes_a_tier_forge_validate_accepts(tmp_path):
    best, node = tmp_path / "tiers" / "best.yaml", tmp_path / "tiers" / "best-node.yaml"
    proc = forge(
        "bench",
        "sweep",
        "tiny-llama-vllm",
        "--node",
        "local-vllm",
        "--workload",
        QUICK,
        "--mode",
        "direct",
        "--records",
        8,
        "--warmup",
        1,
        "--skip",
        "vllm.chunked_prefill",
        "--skip",
        "vllm.long_prefill_token_threshold",
        "--skip",
        "vllm.enforce_eager",
        "--skip",
        "limits.max_num_tokens",
        "--skip",
        "limits.max_batch_size",
        "--set",
        "kv_cache.tokens_per_block=16,64",
        "--confirm-repeat",
        0,
        "--out",
        tmp_path / "s",
        "--write-best",
        best,
        "--write-best-node",
        node,
        "--best-name",
        "tiny-llama-vllm-swept",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "s" / "sweep.json").read_text())
    cands = {c["key"]: c for c in data["candidates"]}
    assert (
        cands["base"]["status"] == "ran"
        and cands["kv_cache.tokens_per_block=64"]["status"] == "ran"
    )
    assert cands["kv_cache.tokens_per_block=16"]["reason"] == ("vLLM's CPU attention takes block "
                                                               "sizes that are a "
                                                               "multiple of 32")
    assert cands["vllm.async_scheduling=true"]["reason"] == "vLLM's CPU platform turns it off"
    assert cands["vllm.attention_backend=FLASH_ATTN"]["status"] == "skipped"
    assert data["written"] == [str(best), str(node)]
    check = forge("validate", node, timeout=60)
    assert check.returncode == 0 and "valid (0 error(s)" in check.stderr, (
        check.stdout + check.stderr
    )
    assert "backend: vllm" in best.read_text() and "tiny-llama-vllm-swept" in best.read_text()
