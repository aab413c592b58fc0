"""Guided output through `forge run --node local-vllm` (the real CLI, card worker and vLLM CPU
engine): a JSON schema vLLM's grammar backend cannot compile is that record's RequestRejected row,
never the engine's death (issue 48: the driver crashed on VLLMValidationError, 0 of 20 rows, exit 4
on every rerun)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOOD = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
# xgrammar cannot compile it
UNIQUE = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


def test_a_schema_the_engine_cannot_compile_is_one_rejected_row_and_the_engine_lives_on(tmp_path):
    records = [
        {"id": i, "text": f"Record {i} of the Queen's garden", "schema": UNIQUE if i == 7 else GOOD}
        for i in range(20)
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_LOAD_PLUGINS": "",
        "FORGE_HOME": str(tmp_path / "home"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            str(FIXTURES / "schema_of_record.py"),
            "--node",
            "local-vllm",
            "--input",
            str(inp),
            "--output",
            str(out),
            "--progress",
            "off",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(20))  # every record once
    (bad,) = [r for r in rows if "error" in r]
    assert bad["index"] == 7 and bad["error"]["type"] == "RequestRejected", bad
    assert (
        "vLLM refused the request" in bad["error"]["message"]
        and "xgrammar" in bad["error"]["message"]
    )
    for r in rows:
        if "result" in r:
            assert json.loads(r["result"]["text"])["ok"] in (True, False)
    report = json.loads(Path(str(out) + ".report.json").read_text())
    (card,) = report["cards"]
    # never restarted
    assert card["healthy"] and card["requests"]["requeued"] == 0 and card["retries"] == 0
    assert "crashed" not in proc.stderr and "restart" not in proc.stderr
