"""The same OpenAI batch file through `vllm run-batch` (vLLM's own runner, on the embedded model
with the engine settings forge's local-vllm contract maps to) and through `forge run --openai-batch
--node local-vllm`: the same custom_ids in the same order, the same greedy texts, the same prompt
token counts, rows of the same shape.

vLLM's run-batch answers /v1/chat/completions (not /v1/completions), and the tiny model has no chat
template: vLLM is given the transcript forge serve uses for such a model (forge/serve/chat.py), BOS
first as the tokenizer adds it to forge's prompt text. FORGE_BATCH_COMPARE_LINES=256 compares a
longer file (docs/openai_batch.md's figure)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from forge.embedded import TINY_MODEL_DIR

REPO = Path(__file__).resolve().parents[2]
TIER = "tiny-llama-vllm"
TRANSCRIPT = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% "
              "endfor %}"
              "{% if add_generation_prompt %}assistant:{% endif %}")
# What forge/engines/vllm/mapping.py gives vLLM for forge/embedded/tiny-llama-vllm.yaml
VLLM_ARGS = [
    "--dtype",
    "float32",
    "--max-model-len",
    "512",
    "--block-size",
    "32",
    "--max-num-seqs",
    "32",
    "--max-num-batched-tokens",
    "512",
    "--enforce-eager",
    "--seed",
    "0",
    "--generation-config",
    "vllm",
    "--kv-cache-memory-bytes",
    str(64 << 20),
]
LINES = int(os.environ.get("FORGE_BATCH_COMPARE_LINES", "32"))
TOPICS = [
    "the sea",
    "a red fox",
    "winter mornings",
    "old libraries",
    "the moon",
    "rain on glass",
    "trains",
    "a garden",
]


def batch_lines(n: int) -> list[dict]:
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}, story "
                                                f"{i}."}]
        if i % 4 == 1:
            messages.insert(0, {"role": "system", "content": "You answer briefly."})
        out.append(
            {
                "custom_id": f"req-{i:03d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": TIER, "messages": messages, "temperature": 0, "max_tokens": 24},
            }
        )
    return out


def text_of(row: dict) -> str:
    return row["response"]["body"]["choices"][0]["message"]["content"]


def test_vllm_run_batch_and_forge_give_the_same_rows(tmp_path):
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in batch_lines(LINES)))
    template = tmp_path / "transcript.jinja"
    template.write_text(TRANSCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_LOAD_PLUGINS": "",
        "FORGE_HOME": str(tmp_path / "home"),
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    vllm_out, forge_out = tmp_path / "vllm.jsonl", tmp_path / "forge.jsonl"
    v = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.run_batch",
            "-i",
            str(batch),
            "-o",
            str(vllm_out),
            "--model",
            str(TINY_MODEL_DIR),
            "--served-model-name",
            TIER,
            "--chat-template",
            str(template),
            *VLLM_ARGS,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert v.returncode == 0, v.stderr[-3000:]
    f = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            "--openai-batch",
            str(batch),
            "--output",
            str(forge_out),
            "--node",
            "local-vllm",
            "--progress",
            "off",
            "--no-report",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert f.returncode == 0, f.stderr[-3000:]
    theirs = [json.loads(x) for x in vllm_out.read_text().splitlines()]
    ours = [json.loads(x) for x in forge_out.read_text().splitlines()]
    assert (
        [r["custom_id"] for r in ours]
        == [r["custom_id"] for r in theirs]
        == [f"req-{i:03d}" for i in range(LINES)]
    )
    assert [text_of(r) for r in ours] == [text_of(r) for r in theirs]
    for a, b in zip(ours, theirs):
        ua, ub = a["response"]["body"]["usage"], b["response"]["body"]["usage"]
        assert ua["prompt_tokens"] == ub["prompt_tokens"]
        # vLLM counts the end-of-sequence token among the completion tokens; forge (serve and batch
        # alike) counts the tokens of the text only: one fewer on a choice that ended at EOS, the
        # same on one cut at max_tokens
        eos = a["response"]["body"]["choices"][0]["finish_reason"] == "stop"
        assert ua["completion_tokens"] + eos == ub["completion_tokens"]
    for a, b in zip(ours, theirs):
        assert set(a) == set(b) and set(a["response"]) == set(b["response"])
        assert (
            (a["error"], a["response"]["status_code"])
            == (b["error"], b["response"]["status_code"])
            == (None, 200)
        )
        assert (
            a["response"]["body"]["choices"][0]["finish_reason"]
            == b["response"]["body"]["choices"][0]["finish_reason"]
        )
