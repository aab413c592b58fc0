"""The real thing: a run through the real ledger + writer, SIGKILLed at seeded random moments and
rerun until complete. Afterwards every input line is in the output exactly once with the right
row, the ledger agrees, and no run ever regenerated a record that was settled when it started."""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _driver import pure  # noqa: E402

DRIVER = Path(__file__).with_name("_driver.py")
REPO = Path(__file__).resolve().parents[2]
RECORDS = 4000
SLOW_WRITE_S = "0.03"
KILLS = 25          # SIGKILL
INTERRUPTS = 5      # SIGINT (Ctrl-C): the run drains what it has and exits


def _write_input(path: Path) -> list[object]:
    """Records plus a few malformed lines; returns what each index should become."""
    rng = random.Random(7)
    expected: list[object] = []
    with open(path, "w") as f:
        for i in range(RECORDS):
            if i % 500 == 250:
                f.write("{not json\n")
                expected.append("InputInvalidJSON")
                continue
            rec = {"id": i, "text": "x" * rng.randint(0, 300)}
            f.write(json.dumps(rec) + "\n")
            try:
                expected.append(pure(rec))
            except ValueError:
                expected.append("ValueError")
    return expected


def _settled_now(output: Path, ledger: Path) -> set[int]:
    """Indices durable after a kill: complete output lines + rows settled in the ledger."""
    done: set[int] = set()
    if output.exists():
        for line in output.read_bytes().split(b"\n")[:-1]:  # the last piece is a torn tail or empty
            done.add(json.loads(line)["index"])
    if ledger.exists():
        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
        try:
            done |= {i for (i,) in db.execute("SELECT idx FROM records WHERE state != 'pending'")}
        except sqlite3.OperationalError:   # killed before the schema existed
            pass
        finally:
            db.close()
    return done


def _start(tmp: Path, run_id: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            str(tmp / "in.jsonl"),
            str(tmp / "out.jsonl"),
            str(tmp / "gen.log"),
            str(run_id),
            SLOW_WRITE_S,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp,
    )


@pytest.mark.timeout(120)
def test_sigkill_at_random_points_loses_nothing_and_duplicates_nothing(tmp_path):
    expected = _write_input(tmp_path / "in.jsonl")
    output, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
    rng = random.Random(20240611)
    settled_before: dict[int, set[int]] = {}
    kills = interrupts = run_id = 0
    reports: list[dict] = []
    after_interrupt: list[int] = []          # run ids that started right after a Ctrl-C
    while True:
        run_id += 1
        settled_before[run_id] = _settled_now(output, ledger)
        proc = _start(tmp_path, run_id)
        if run_id % 5 == 4 and interrupts < INTERRUPTS:
            line = proc.stdout.readline()
            assert line.startswith("ready "), proc.stderr.read()
            reports.append({"run": run_id, **json.loads(line.split(" ", 1)[1])})
            time.sleep(rng.uniform(0.05, 0.25))
            finished = proc.poll() is not None
            if not finished:
                proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            # a run that ended between poll() and the signal's arrival exits 0, its work done: both
            # are right
            assert proc.returncode in ((0,) if finished else (0, 130)), err
            interrupts += 1
            after_interrupt.append(run_id + 1)
            continue
        if kills < KILLS:
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.0, 0.4))          # anywhere: import, reconcile, recovery
            else:
                line = proc.stdout.readline()
                assert line.startswith("ready "), proc.stderr.read()
                reports.append({"run": run_id, **json.loads(line.split(" ", 1)[1])})
                time.sleep(rng.uniform(0.0, 0.25))         # mid-run: commits, writes, fsyncs
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        if out.startswith("ready "):  # not yet read above
            reports.append(
                {"run": run_id, **json.loads(out.split("ready ", 1)[1].split("\n", 1)[0])}
            )
        if kills >= KILLS:
            break
    assert kills == KILLS and interrupts == INTERRUPTS
    # after a Ctrl-C everything handed over was committed, written and marked: nothing to repair
    for r in reports:
        if r["run"] in after_interrupt:
            assert r["adopted"] == r["recovered"] == r["truncated_bytes"] == 0, r
    # the kills landed where they matter: rows were recovered from the ledger without regenerating
    # them (killed between commit and write) and adopted from the output (between fsync and mark)
    print("resume reports:", reports)
    assert sum(r["recovered"] for r in reports) > 0
    assert sum(r["adopted"] for r in reports) > 0
    assert any(r["already_written"] for r in reports)

    # every input line exactly once, with the right row
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(RECORDS))
    for row in rows:
        want = expected[row["index"]]
        if isinstance(want, str):
            assert row["error"]["type"] == want
        else:
            assert row["result"] == want

    # the ledger agrees: all written, nothing left in flight, error rows counted
    db = sqlite3.connect(ledger)
    states = dict(db.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall())
    errors = db.execute("SELECT COUNT(*) FROM records WHERE is_error").fetchone()[0]
    leftover = db.execute("SELECT COUNT(*) FROM records WHERE row IS NOT NULL").fetchone()[0]
    db.close()
    assert states == {"written": RECORDS}
    assert errors == sum(isinstance(w, str) for w in expected)
    assert leftover == 0

    # no run generated a record that was settled (ledger or output) when it started
    regenerated = []
    for line in (tmp_path / "gen.log").read_text().splitlines():
        rid, index = map(int, line.split())
        if index in settled_before[rid]:
            regenerated.append((rid, index))
    assert regenerated == []
