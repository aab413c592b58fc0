"""A two-step job's rows land in a steady stream (issue 50): on the embedded node, through the real
CLI and the real tiny engine, a record's second call goes ahead of other records' first calls, and
only as many records start as the card finishes soon. Checked on a logical clock the function keeps
(how many first calls had returned, and how many records had started, when each record finished), so
the test does not depend on the machine's speed.

Before this, every record's first call ran before any second one: the first row came after all N
first calls (N - ~40: those already queued in the card's host), and all N records were in flight
from the start."""
import pytest

from forge.functions.pace import FLOOR_PER_SLOT, UNKNOWN_FLOOR
from tests.e2e.helpers import REPO, forge, read_output, write_records

pytestmark = [pytest.mark.engine, pytest.mark.slow]

RECORDS = 384  # fewer than the default --concurrency (1,024): all could start at once
SLOTS = 32     # the embedded contract's max_batch_size


def test_first_rows_land_before_most_first_calls_and_few_records_wait_in_flight(tmp_path):
    texts = [
        line
        for line in (REPO / "functions/data/summarize.jsonl").read_text().splitlines()
        if line.strip()
    ]
    inp = write_records(
        tmp_path / "in.jsonl",
        [
            line.replace('"id": "', f'"id": "{i}-', 1)
            for i, line in enumerate(texts * (RECORDS // len(texts) + 1))
        ][:RECORDS],
    )
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        REPO / "tests/e2e/fixtures/two_step.py",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = sorted((row["result"] for row in read_output(out)), key=lambda row: row["finished"])
    # every record, each once
    assert [row["finished"] for row in rows] == list(range(1, RECORDS + 1))
    first = rows[0]
    # The first row lands once a handful of first calls are back, not after (nearly) all of them.
    assert first["first_calls_done"] <= RECORDS // 2, first
    # When it lands, only the gate's floor of records had started: 4 x the card's slots, not all of
    # them.
    assert first["started"] <= max(FLOOR_PER_SLOT * SLOTS, UNKNOWN_FLOOR), first
