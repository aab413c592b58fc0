"""Mixed engines on one queue: node_descriptions/local-mixed.yaml (the tiny model through transformers on cpu0 and
through vLLM on cpu1) runs one `forge run` job: every record comes back exactly once and both cards did work."""
from __future__ import annotations

import collections
import json

import pytest

from tests.e2e.helpers import forge, read_output, write_records

pytestmark = pytest.mark.engine


@pytest.mark.timeout(400)
def test_one_job_on_a_transformers_card_and_a_vllm_card(tmp_path):
    n = 240
    inp = write_records(tmp_path / "in.jsonl", [{"id": i, "text": f"Record {i}: the quick brown fox " * 3,
                                                 "max_tokens": 16} for i in range(n)])
    out = tmp_path / "out.jsonl"
    r = forge("run", "tests/e2e/fixtures/short.py", "--node", "node_descriptions/local-mixed.yaml", "--input", inp,
              "--output", out, "--concurrency", "64", timeout=380)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_output(out)
    assert sorted(row["index"] for row in rows) == list(range(n))              # every record, once
    cards = collections.Counter(row["result"]["card"] for row in rows)
    assert set(cards) == {"cpu0", "cpu1"} and min(cards.values()) > 0, cards    # both engines did work
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["summary"]["records_done"] == n
