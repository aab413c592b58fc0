"""The run ledger: one SQLite file (WAL) holding what each record's state is and, until its
output line is durable, the output row itself — so a crashed run writes it without regenerating.

Durability: WAL with synchronous=NORMAL. A commit survives a killed process (kill -9, Ctrl-C,
a crash): it is in the WAL through the OS. Only a power loss / OS crash can roll back the last
commits, and the resume protocol stays correct then too (see docs/ledger.md): an output line is
fsync'ed before its record is marked 'written', so the ledger never claims more than the output
holds, and a lost 'done' only costs regenerating that record. The run identity (meta) is written
with synchronous=FULL so a ledger never loses the fact that it exists."""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError, display_path
from forge.ledger.damage import LedgerDamaged, LedgerMismatch, as_forge_error, reads
from forge.records.bitmap import IndexBitmap
from forge.stats import LedgerStats

SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    idx      INTEGER PRIMARY KEY,                 -- 0-based input record index
    state    TEXT NOT NULL CHECK (state IN ('pending', 'done', 'failed', 'written')),
    attempts INTEGER NOT NULL DEFAULT 0,          -- function invocations started, across restarts
    is_error INTEGER NOT NULL DEFAULT 0,          -- the output row is an error row
    row      TEXT                                 -- the output line, kept only until it is written
);
"""
_ATTEMPT = ("INSERT INTO records (idx, state, attempts) VALUES (?, 'pending', 1) "
            "ON CONFLICT (idx) DO UPDATE SET attempts = attempts + 1")
_SETTLE = ("INSERT INTO records (idx, state, is_error, row) VALUES (?, ?, ?, ?) "
           "ON CONFLICT (idx) DO UPDATE SET state = excluded.state, is_error = excluded.is_error, "
           "row = excluded.row WHERE records.state != 'written'")
_WRITTEN = ("INSERT INTO records (idx, state, is_error) VALUES (?, 'written', ?) "
            "ON CONFLICT (idx) DO UPDATE SET state = 'written', is_error = excluded.is_error, row "
            "= NULL")
# The same two writes as plain UPDATEs of rows that exist. In a running job they nearly always do
# (the attempt row went in first), and an UPDATE by rowid costs SQLite about half of what the
# upsert's failed INSERT + UPDATE does (docs/benchmarks.md, "Control plane"). Where fewer rows
# changed than were given (an input error settled without an attempt row, a row already written),
# the upserts above run for the whole batch.
_SETTLE_EXISTING = ("UPDATE records SET state = ?, is_error = ?, row = ? WHERE idx = ? AND state "
                    "!= 'written'")
_WRITTEN_EXISTING = "UPDATE records SET state = 'written', is_error = ?, row = NULL WHERE idx = ?"


@dataclass(frozen=True)
class LedgerCounts:
    pending: int = 0          # invoked, no result committed yet (in flight when the run stopped)
    done: int = 0             # result committed, output line not yet written
    failed: int = 0           # error row committed, not yet written
    written: int = 0          # in the output, durably
    written_errors: int = 0   # of those, error rows
    attempts: int = 0         # function invocations started, summed
    retried: int = 0          # records invoked more than once (across restarts)


class Ledger:
    """One run's ledger. Exclusively locked (flock) while open; safe to call from two threads."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        run_key: dict[str, object],
        restart: bool = False,
        info: dict[str, object] | None = None,
        accept_changes: Iterable[str] = (),
        owner: str | None = None,
    ) -> None:
        """`run_key` must match on resume (else LedgerMismatch), except the keys in
        `accept_changes`, which the user declared compatible: the ledger then takes them on and
        `accepted` lists them. `info` (node, paths...) is only recorded, and `starts` counts how
        often the run was started. `owner`: the output this ledger is opened for (its name as JSON);
        a ledger recording another output is refused, even on restart."""
        self.accepted: list[str] = []
        self._owner = owner
        self.path = Path(path)
        self.stats = LedgerStats()
        self._shown = display_path(self.path)
        self._mutex = threading.Lock()
        self._lock_fd = self._take_file_lock()
        try:
            self._db = self._connect()
            self.fresh = self._check_identity(dict(run_key), restart, frozenset(accept_changes))
            self.starts = int(self.get_meta("starts") or 0) + 1
            self.set_meta("starts", str(self.starts))
            self.set_meta("info", json.dumps(info or {}, sort_keys=True, default=str))
        except BaseException as e:
            if hasattr(self, "_db"):
                self._db.close()
            os.close(self._lock_fd)
            mapped = as_forge_error(self._shown, e)
            if mapped is not e:
                raise mapped from None
            raise

    # --- opening -----------------------------------------------------------------------------
    def _take_file_lock(self) -> int:
        if not self.path.parent.is_dir():
            raise ForgeError(f"{self._shown}: the ledger's folder does not exist")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise ForgeError(f"{self._shown}: cannot open the ledger: {e.strerror}") from None
        else:
            # /dev/null, a FIFO, a folder: SQLite would write its -journal or -wal beside it
            # (/dev/null-journal)
            if not stat.S_ISREG(st.st_mode):
                raise ForgeError(f"{self._shown}: is not a regular file; a ledger is an SQLite "
                                 "file forge creates: "
                                 "point --ledger elsewhere")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ForgeError(f"{self._shown}: cannot open the ledger: {e.strerror}") from None
        try:
            # flock, not fcntl: SQLite's own POSIX locks on the same file are unaffected by it.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ForgeError(f"{self._shown}: another forge run is using this ledger") from None
        head = os.pread(fd, len(_SQLITE_MAGIC), 0)
        if head and head != _SQLITE_MAGIC:
            os.close(fd)
            raise ForgeError(f"{self._shown}: not a forge ledger (not an SQLite file); "
                             "point --ledger elsewhere")
        return fd

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=5.0
            )
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = "
                                                     "'table'")}
            if tables and not {"meta", "records"} <= tables:
                # someone else's database: forge changes nothing in it, not even its journal mode
                db.close()
                raise ForgeError(f"{self._shown}: not a forge ledger (an SQLite database with "
                                 "tables "
                                 f"{', '.join(sorted(tables)[:5])}); point --ledger elsewhere")
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise ForgeError(f"{self._shown}: the ledger's file system does not support SQLite "
                                 "WAL")
            db.execute("PRAGMA synchronous=FULL")       # until the identity is stored
            db.executescript(_SCHEMA)
            return db
        # the file system's: a folder taking no new file (-wal), a lock
        except sqlite3.OperationalError as e:
            raise ForgeError(f"{self._shown}: cannot open the ledger: {e} (SQLite also needs to "
                             "create "
                             f"{self.path.name}-wal beside it)") from None
        except sqlite3.DatabaseError as e:
            raise LedgerDamaged(self._shown, str(e)) from None

    def _check_identity(
        self, run_key: dict[str, object], restart: bool, accept: frozenset[str]
    ) -> bool:
        stored = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        fresh = not stored
        recorded = stored.get("output")
        if self._owner is not None and recorded is not None and recorded != self._owner:
            # checked before a --restart resets it: --restart discards this output's run, never
            # another's
            raise ForgeError(f"{self._shown}: this ledger records the run writing "
                             f"{_unjson(recorded)}, not "
                             f"{_unjson(self._owner)}; name this output's own ledger with --ledger "
                             "PATH (not even "
                             "--restart takes another output's ledger over)")
        if stored and not restart:
            # A resumed ledger is read whole anyway (indices, counts): check its structure first, so
            # damage is named here, with the file, rather than by whichever query meets it.
            found = [r[0] for r in self._db.execute("PRAGMA quick_check(3)").fetchall()]
            if found != ["ok"]:
                raise LedgerDamaged(self._shown, "; ".join(str(f) for f in found))
            if not isinstance(json.loads(stored.get("run_key", "{}")), dict):
                raise LedgerDamaged(self._shown, "its run_key is not a JSON object")
        if stored and restart:
            self.reset(run_key)
            fresh = True
        elif stored:
            if stored.get("schema_version") != str(SCHEMA_VERSION):
                raise LedgerMismatch(f"{self._shown}: ledger schema {stored.get('schema_version')} "
                                     "is not "
                                     f"{SCHEMA_VERSION}; pass --restart to start over")
            old = json.loads(stored.get("run_key", "{}"))
            changed = [k for k in sorted(set(old) | set(run_key)) if old.get(k) != run_key.get(k)]
            if changed and set(changed) <= accept:
                self.accepted = changed
                with self._txn():
                    self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('run_key', "
                                     "?)",
                                     (json.dumps(run_key, sort_keys=True),))
            elif changed:
                raise LedgerMismatch(self._mismatch(old, run_key, changed))
        else:
            self._write_meta(run_key)
        self._db.execute("PRAGMA synchronous=NORMAL")
        return fresh and not self._has_records()

    def _mismatch(self, old: dict, new: dict, changed: list[str]) -> str:
        diffs = "; ".join(
            f"{k} was {_short(old.get(k))}, now {_short(new.get(k))}" for k in changed
        )
        if changed == ["function_sha256"]:
            done = self._db.execute(
                "SELECT COUNT(*) FROM records WHERE state != 'pending'"
            ).fetchone()[0]
            return (f"{self._shown}: the function file changed since this run started "
                    f"({new.get('function')}: "
                    f"{diffs}); if the change leaves the {done:,} finished row(s) valid, pass "
                    "--accept-changed-function to keep them and run the rest with the new code; "
                    "--restart "
                    "discards the output and starts over")
        return (f"{self._shown}: this ledger belongs to another run ({diffs}); pass --restart to "
                "discard it and "
                "the output and start over, or write to another --output")

    def _write_meta(self, run_key: dict[str, object]) -> None:
        rows = [("schema_version", str(SCHEMA_VERSION)), ("created", f"{time.time():.3f}"),
                ("run_key", json.dumps(run_key, sort_keys=True))]
        with self._txn():
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)

    def _has_records(self) -> bool:
        return self._db.execute("SELECT 1 FROM records LIMIT 1").fetchone() is not None

    # --- writing -----------------------------------------------------------------------------
    def reset(self, run_key: dict[str, object]) -> None:
        """Forget every record and take on a new identity (--restart)."""
        with self._mutex:
            self._db.execute("PRAGMA synchronous=FULL")
            with self._txn():
                self._db.execute("DELETE FROM records")
                self._db.execute("DELETE FROM meta")
            self._write_meta(run_key)
            self._db.execute("PRAGMA synchronous=NORMAL")

    def apply(self, *, attempts: Iterable[int] = (), settled: Iterable[tuple[int, str, bool]] = (),
              written: Iterable[tuple[int, bool]] = ()) -> None:
        """One transaction: count attempts, store settled rows (idx, row, is_error) as done/failed,
        mark rows written (idx, is_error) and drop their stored row."""
        attempts = [(i,) for i in attempts]
        settled = [(i, "failed" if err else "done", int(err), row) for i, row, err in settled]
        written = [(i, int(err)) for i, err in written]
        with self._mutex:
            start = time.perf_counter()
            with self._txn():
                if attempts:
                    self._db.executemany(_ATTEMPT, attempts)
                if settled:
                    self._upsert(
                        _SETTLE_EXISTING, _SETTLE, settled, lambda r: (r[1], r[2], r[3], r[0])
                    )
                if written:
                    self._upsert(_WRITTEN_EXISTING, _WRITTEN, written, lambda r: (r[1], r[0]))
            elapsed = time.perf_counter() - start
        self.stats.commits += 1
        self.stats.rows_committed += len(attempts) + len(settled) + len(written)
        self.stats.last_commit_s = elapsed
        self.stats.total_commit_s += elapsed

    def _upsert(self, update: str, upsert: str, rows: list[tuple], update_args) -> None:
        """UPDATE the rows that exist; if any did not change, the idempotent upsert for all (same
        end state)."""
        if self._db.executemany(update, [update_args(r) for r in rows]).rowcount != len(rows):
            self._db.executemany(upsert, rows)

    def forget(self, indices: Iterable[int]) -> None:
        """Make these records pending again, as never settled (their output rows were lost outside
        forge)."""
        rows = [(i,) for i in indices]
        with self._mutex, self._txn():
            self._db.executemany("UPDATE records SET state = 'pending', is_error = 0, row = NULL "
                                 "WHERE idx = ?", rows)

    def reopen(self, indices: Iterable[int], *, unfinalize: bool = False) -> None:
        """One transaction: these written records become pending again, to be run again
        (--retry-errors); with `unfinalize`, the run is no longer finalized (its Parquet file is
        made again when it completes)."""
        rows = [(i,) for i in indices]
        with self._mutex, self._txn():
            self._db.executemany("UPDATE records SET state = 'pending', is_error = 0, row = NULL "
                                 "WHERE idx = ?", rows)
            if unfinalize:
                self._db.execute("DELETE FROM meta WHERE key = 'finalized'")

    def set_meta(self, key: str, value: str) -> None:
        with self._mutex, self._txn():
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    @reads
    def get_meta(self, key: str) -> str | None:
        with self._mutex:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # --- reading -----------------------------------------------------------------------------
    def unwritten_rows(self, chunk: int = 2048) -> Iterator[list[tuple[int, str, bool]]]:
        """Settled rows not yet in the output, in index order and in chunks (keyset pages, so the
        caller may mark them written between chunks)."""
        last = -1
        while page := self._unwritten_page(last, chunk):
            last = page[-1][0]
            yield page

    @reads
    def _unwritten_page(self, after: int, chunk: int) -> list[tuple[int, str, bool]]:
        with self._mutex:
            page = self._db.execute(
                "SELECT idx, row, is_error FROM records WHERE state IN ('done', 'failed') AND idx "
                "> ? "
                "ORDER BY idx LIMIT ?", (after, chunk)).fetchall()
        for i, row, _ in page:
            if not isinstance(i, int) or not isinstance(row, str):
                raise TypeError(f"record {i!r} holds no row to write")
        return [(i, row, bool(err)) for i, row, err in page]

    @reads
    def indices(
        self, *states: str, attempts: int | None = None, errors: bool = False
    ) -> IndexBitmap:
        """Indices in the given states (with exactly `attempts` invocations, when given; only error
        rows, with `errors`), streamed into a bitmap (never a list of 10M ints)."""
        marks = ",".join("?" * len(states))
        query, args = f"SELECT idx FROM records WHERE state IN ({marks})", tuple(states)
        if attempts is not None:
            query, args = query + " AND attempts = ?", args + (attempts,)
        if errors:
            query += " AND is_error = 1"
        found = IndexBitmap()
        with self._mutex:
            for (i,) in self._db.execute(query, args):
                found.add(i)
        return found

    @reads
    def counts(self) -> LedgerCounts:
        with self._mutex:
            by_state = dict(
                self._db.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall()
            )
            errs, attempts, retried = self._db.execute(
                "SELECT COALESCE(SUM(state = 'written' AND is_error), 0), COALESCE(SUM(attempts), "
                "0), "
                "COALESCE(SUM(attempts > 1), 0) FROM records").fetchone()
        return LedgerCounts(pending=by_state.get("pending", 0), done=by_state.get("done", 0),
                            failed=by_state.get("failed", 0), written=by_state.get("written", 0),
                            written_errors=errs, attempts=attempts, retried=retried)

    def compact(self) -> None:
        """Give back the space of the output rows the ledger held until they were written (rows are
        set to NULL in place, which leaves ~130 bytes per record in the file; compacted, a finished
        run keeps ~20). Best effort: a failure (e.g. no room for the copy VACUUM makes) leaves a
        correct, larger ledger."""
        with self._mutex:
            try:
                self._db.execute("VACUUM")
            except sqlite3.Error:
                pass

    def close(self) -> None:
        if self._lock_fd < 0:
            return
        try:
            with self._mutex:
                self._db.close()      # checkpoints the WAL into the main file
        finally:
            # only now: releases the flock after SQLite is done (or failed to)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- helpers -----------------------------------------------------------------------------
    def _txn(self):
        return _Transaction(self._db, self._shown)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error; SQLite errors become one clear line."""

    def __init__(self, db: sqlite3.Connection, shown: str) -> None:
        self._db, self._shown = db, shown

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.Error as e:
                exc = e
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise ForgeError(f"{self._shown}: ledger write failed: {exc}") from None


def _unjson(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:12] + "…" + text[-8:]
