"""Mixed engines on one queue: node_descriptions/local-mixed.yaml (the tiny model through transformers on cpu0 and
through vLLM on cpu1) runs one `forge run` job: every record comes back exactly once and both cards did work."""
from __future__ import annotations

import asyncio
import collections
import json
import os
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge.functions.api import GenerateParams
from forge.node.local import LocalNode
from tests.e2e.helpers import forge, read_output, write_records

NODE = Path(__file__).resolve().parents[2] / "node_descriptions" / "local-mixed.yaml"

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


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


@pytest.mark.timeout(300)
def test_each_card_runs_on_its_own_cores():
    """cards[].cores: each card's worker, every thread in it (vLLM's CPU worker binds its OpenMP threads to the
    cores it may use) and any process it started, may run only on that card's cores; both cards answer."""
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cores 0 and 1")

    async def main():
        node = LocalNode(load_node(NODE))
        await node.start()
        try:
            seen = {}
            for t in node.transports:
                procs = [t.pid, *_descendants(t.pid)]
                threads = [int(tid) for p in procs for tid in os.listdir(f"/proc/{p}/task")]
                seen[t.name] = {tid: os.sched_getaffinity(tid) for tid in threads}
            answers = await asyncio.gather(*(node.generate(f"Record {i}: the quick brown fox", GenerateParams(
                max_tokens=4)) for i in range(16)))
            return seen, answers
        finally:
            await node.stop()

    seen, answers = asyncio.run(main())
    assert len(answers) == 16
    by_card = {name.split(".")[0]: procs for name, procs in seen.items()}
    assert set(by_card) == {"cpu0", "cpu1"}, seen
    assert all(mask == {0} for mask in by_card["cpu0"].values()), seen
    assert all(mask == {1} for mask in by_card["cpu1"].values()), seen
