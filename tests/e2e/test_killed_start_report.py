"""A start killed with SIGKILL writes no report; the report of the start that resumes it still lists
it (from the ledger, which counts every start), with the rows it left, instead of leaving it out."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.helpers import REPO, write_records

pytestmark = pytest.mark.engine


def test_a_killed_start_appears_in_the_resumed_report(tmp_path):
    inp = write_records(tmp_path / "in.jsonl", [{"id": i} for i in range(8)])
    out = tmp_path / "out.jsonl"
    args = [
        sys.executable,
        "-m",
        "forge",
        "run",
        "tests/e2e/fixtures/stall_when_asked.py",
        "--input",
        str(inp),
        "--output",
        str(out),
        "--progress",
        "off",
    ]
    first = subprocess.Popen(
        args,
        cwd=REPO,
        env={**os.environ, "STALL": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (
            not out.exists() or len(out.read_text().splitlines()) < 4
        ):
            time.sleep(0.2)
        assert out.exists() and len(out.read_text().splitlines()) >= 4, (
            "the first start wrote no rows"
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert not out.with_name(out.name + ".report.json").exists()     # killed: it wrote no report

    second = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    runs = report.get("runs") or []
    assert len(runs) == 2, runs
    killed, resumed = runs
    assert killed["done"] == 4 and "no report" in killed["interrupted"], killed
    assert resumed["done"] == 4, resumed
    md = out.with_name(out.name + ".report.md").read_text()
    assert "## Runs" in md and "no report" in md
