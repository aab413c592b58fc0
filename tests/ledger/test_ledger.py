"""The SQLite ledger on its own: identity, locking, batched state changes, bounded reads."""
from __future__ import annotations

import sqlite3

import pytest

from forge.errors import ForgeError
from forge.ledger import Ledger, LedgerCounts, LedgerMismatch

KEY = {"function": "f.py:f", "function_sha256": "a" * 64, "input_size": 10}


def test_identity_is_kept_and_a_different_run_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    led = Ledger(path, run_key=KEY)
    assert led.fresh
    led.apply(attempts=[1])
    led.close()
    led = Ledger(path, run_key=KEY)
    assert not led.fresh and led.counts().attempts == 1
    led.close()
    with pytest.raises(LedgerMismatch, match=r"the function file changed since this run started "
                                             r"\(.*: function_sha256 "
                                             r"was aaaaaaaaaaaa…aaaaaaaa, now "
                                             r"bbbbbbbbbbbb…bbbbbbbb\); if the change "
                                             r"leaves the 0 finished row\(s\) valid, pass "
                                             r"--accept-changed-function"):
        Ledger(path, run_key={**KEY, "function_sha256": "b" * 64})
    with pytest.raises(LedgerMismatch, match=r"belongs to another run \(input_size was .*\); pass "
                                             r"--restart"):
        Ledger(path, run_key={**KEY, "input_size": 7}, accept_changes=["function_sha256"])
    led = Ledger(path, run_key={**KEY, "function_sha256": "b" * 64}, restart=True)
    assert led.fresh and led.counts() == LedgerCounts()
    led.close()


def test_a_changed_function_declared_compatible_keeps_the_records(tmp_path):
    path = tmp_path / "l.sqlite"
    led = Ledger(path, run_key=KEY)
    led.apply(written=[(0, False), (1, True)])
    led.close()
    new = {**KEY, "function_sha256": "c" * 64}
    led = Ledger(path, run_key=new, accept_changes=["function_sha256"])
    assert led.accepted == ["function_sha256"] and not led.fresh
    assert led.counts().written == 2 and led.counts().written_errors == 1
    led.close()
    led = Ledger(path, run_key=new)                   # the new code is now the run's identity
    assert led.accepted == []
    led.close()
    with pytest.raises(LedgerMismatch, match="2 finished row"):
        Ledger(path, run_key=KEY)


def test_a_ledger_is_used_by_one_run_at_a_time(tmp_path):
    led = Ledger(tmp_path / "l.sqlite", run_key=KEY)
    with pytest.raises(ForgeError, match="another forge run is using this ledger"):
        Ledger(tmp_path / "l.sqlite", run_key=KEY)
    led.close()
    Ledger(tmp_path / "l.sqlite", run_key=KEY).close()


def test_files_that_are_not_ledgers_are_refused(tmp_path):
    (tmp_path / "x").write_text("hello, I am a text file with some length")
    with pytest.raises(ForgeError, match="not a forge ledger"):
        Ledger(tmp_path / "x", run_key=KEY)
    with pytest.raises(ForgeError, match="the ledger's folder does not exist"):
        Ledger(tmp_path / "no" / "l.sqlite", run_key=KEY)


def test_state_changes_in_one_transaction_and_rows_dropped_once_written(tmp_path):
    led = Ledger(tmp_path / "l.sqlite", run_key=KEY)
    led.apply(attempts=[0, 1, 2, 3, 3])
    led.apply(settled=[(0, "row0", False), (1, "row1", True), (2, "row2", False)])
    assert led.counts() == LedgerCounts(pending=1, done=2, failed=1, attempts=5, retried=1)
    chunks = list(led.unwritten_rows(chunk=2))
    assert chunks == [[(0, "row0", False), (1, "row1", True)], [(2, "row2", False)]]
    led.apply(written=[(0, False), (1, True)])
    # a late settle can never overwrite a written row
    led.apply(settled=[(0, "again", False)])
    assert sorted(led.indices("written")) == [0, 1] and sorted(led.indices("done", "pending")) == [
        2,
        3,
    ]
    assert led.counts() == LedgerCounts(
        pending=1, done=1, written=2, written_errors=1, attempts=5, retried=1
    )
    assert (
        led.stats.commits == 4 and led.stats.rows_committed == 11 and led.stats.total_commit_s > 0
    )
    led.close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    assert db.execute("SELECT row FROM records WHERE state = 'written'").fetchall() == [
        (None,),
        (None,),
    ]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_a_batch_mixing_rows_with_and_without_an_attempt_settles_them_all(tmp_path):
    # apply() first UPDATEs rows that exist and falls back to the upsert when some do not (an input
    # error is settled without an attempt row; `written` can name rows the ledger lost): the end
    # state is the upsert's.
    led = Ledger(tmp_path / "l.sqlite", run_key=KEY)
    led.apply(attempts=[0, 1])
    led.apply(settled=[(0, "row0", False), (1, "row1", False)], written=[])
    led.apply(written=[(0, False)])
    led.apply(settled=[(0, "late", False), (1, "row1b", True), (5, "input error", True)])
    assert led.counts() == LedgerCounts(failed=2, written=1, attempts=2)
    assert list(led.unwritten_rows()) == [[(1, "row1b", True), (5, "input error", True)]]
    led.apply(written=[(1, True), (5, True), (7, False)])
    assert sorted(led.indices("written")) == [0, 1, 5, 7]
    assert led.counts() == LedgerCounts(written=4, written_errors=2, attempts=2)
    db = sqlite3.connect(tmp_path / "l.sqlite")
    assert db.execute(
        "SELECT idx, state, attempts, is_error, row FROM records ORDER BY idx"
    ).fetchall() == [
        (0, "written", 1, 0, None),
        (1, "written", 1, 1, None),
        (5, "written", 0, 1, None),
        (7, "written", 0, 0, None),
    ]
    db.close()
    led.close()
