"""Mixed engines on one queue: node_descriptions/local-mixed.yaml (the tiny model through
transformers on cpu0 and through vLLM on cpu1) runs one `forge run` job: every record comes back
exactly once and both cards did work."""
from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import read_output, write_records
from tests.node.test_worker_lifecycle import worker_pids
from tests.reliability._rel import forge_argv, kill9, start

pytestmark = pytest.mark.engine


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


def _affinities(worker: int) -> dict[int, set[int]]:
    """Every thread of the worker and of any process it started: the cores it may run on."""
    threads = [
        int(tid) for p in (worker, *_descendants(worker)) for tid in os.listdir(f"/proc/{p}/task")
    ]
    return {tid: os.sched_getaffinity(tid) for tid in threads}


def _card_of(worker: int) -> str:
    """local-mixed.yaml's card of a worker: cpu1 is the one that loaded vLLM."""
    return "cpu1" if "/vllm/" in Path(f"/proc/{worker}/maps").read_text() else "cpu0"


def _cards_so_far(out: Path) -> set[str]:
    try:
        lines = out.read_bytes().split(b"\n")[:-1]  # the last piece is a row still being written
    except FileNotFoundError:
        return set()
    return {json.loads(line)["result"]["card"] for line in lines}


@pytest.mark.timeout(400)
def test_one_job_on_a_transformers_card_and_a_vllm_card_each_on_its_own_cores(tmp_path):
    """One `forge run` on local-mixed.yaml: every record once, both engines did work; and while both
    answer, cards[].cores holds: each card's worker, every thread in it (vLLM's CPU worker binds its
    OpenMP threads to the cores it may use) and any process it started, may run only on that card's
    cores."""
    cores = {0, 1} <= os.sched_getaffinity(0)
    n = 240
    inp = write_records(tmp_path / "in.jsonl", [{"id": i, "text": f"Record {i}: the quick brown "
                                                                  "fox " * 3,
                                                 "max_tokens": 16} for i in range(n)])
    out, err = tmp_path / "out.jsonl", tmp_path / "run.err"
    proc = start(
        forge_argv(
            "run",
            "tests/e2e/fixtures/short.py",
            "--node",
            "node_descriptions/local-mixed.yaml",
            "--input",
            inp,
            "--output",
            out,
            "--concurrency",
            "64",
        ),
        stderr_path=err,
    )
    seen: dict[str, dict[int, set[int]]] = {}
    try:
        while cores and proc.poll() is None and not seen:
            if _cards_so_far(out) == {"cpu0", "cpu1"}:        # both engines are up and answering
                workers = worker_pids(proc.pid)
                assert len(workers) == 2, workers
                seen = {_card_of(w): _affinities(w) for w in workers}
            time.sleep(0.05)
        rc = proc.wait(timeout=380)
    finally:
        kill9(proc)
    assert rc == 0, err.read_text()[-3000:]
    rows = read_output(out)
    assert sorted(row["index"] for row in rows) == list(range(n))              # every record, once
    cards = collections.Counter(row["result"]["card"] for row in rows)
    # both engines did work
    assert set(cards) == {"cpu0", "cpu1"} and min(cards.values()) > 0, cards
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["summary"]["records_done"] == n
    if not cores:
        pytest.skip("the job ran; the cores check needs cores 0 and 1")
    assert seen, "the job ended before both cards had answered: the cores were not checked"
    assert set(seen) == {"cpu0", "cpu1"}, seen
    assert all(mask == {0} for mask in seen["cpu0"].values()), seen
    assert all(mask == {1} for mask in seen["cpu1"].values()), seen
