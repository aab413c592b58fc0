"""A ledger that is damaged or lost: rebuilt from the output when the output is complete, else
refused saying which file and what to do. Never a silent restart: rows the output holds are not
generated again.

A damaged ledger (flipped bytes, a torn copy) is set aside as `<ledger>.damaged-<time>` (with its
-wal/-shm), never deleted. A complete output means every input index exactly once, no torn or
foreign bytes (for Parquet: the staging file, or the finished Parquet file's index column). Such an
output explains itself: a new ledger marks every row written (error rows as errors) and the run is
complete without generating anything. What cannot be checked is which function and input made those
rows; the message says so, and --restart makes them again."""
from __future__ import annotations

import os
import time
from pathlib import Path

from forge.errors import ForgeError, display_path
from forge.ledger.damage import LedgerDamaged
from forge.ledger.sqlite import Ledger
from forge.records import parquet_out
from forge.records.reader import is_parquet
from forge.records.writer import Reconciliation

_CHUNK = 4096


def set_aside_damaged(
    damaged: LedgerDamaged,
    ledger_path: Path,
    output: Path,
    rec: Reconciliation,
    total: int,
    *,
    restart: bool,
) -> str:
    """Move the damaged ledger aside when it is to be replaced (--restart, or an output complete
    enough to rebuild from) and say what happened; else raise the one line that says what to do."""
    led = display_path(ledger_path)
    if not restart and not _complete(rec, output, total):
        held = rec.rows if rec.rows or not is_parquet(output) else 0
        raise ForgeError(f"{damaged}. The output {display_path(output)} holds {held:,} of "
                         f"{total:,} rows, so the "
                         f"ledger cannot be rebuilt from it: restore {led} from a backup, or pass "
                         "--restart to start "
                         f"over (the damaged ledger is kept as {led}.damaged-…)")
    kept = ledger_path.with_name(f"{ledger_path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    # the WAL belongs to that file: left here it would be replayed into a new one
    for suffix in ("", "-wal", "-shm"):
        src = ledger_path.with_name(ledger_path.name + suffix)
        if src.exists():
            os.replace(src, kept.with_name(kept.name + suffix))
    return f"damaged ({damaged.why}); kept as {display_path(kept)}"


def rebuild_or_refuse(
    ledger: Ledger, written_path: Path, rec: Reconciliation, output: Path, total: int, *, why: str
) -> str:
    """A new ledger (`why`: "missing", or what was damaged) beside an output that holds rows.
    Complete: rebuild (mark every row written) and return the line to print. Not complete: refuse;
    these rows are not this run's to extend or overwrite."""
    led = display_path(ledger.path)
    if not _complete(rec, output, total):
        if is_parquet(output) and output.exists():
            raise ForgeError(f"{display_path(output)}: exists but its ledger {led} is new; forge "
                             "never writes over an "
                             "output no ledger records: pass --restart to replace it, or --ledger "
                             "PATH to name its "
                             "ledger")
        raise ForgeError(f"{display_path(written_path)}: already holds {rec.rows:,} rows but its "
                         f"ledger {led} is new; "
                         f"forge never writes over an output no ledger records, and {rec.rows:,} "
                         f"of {total:,} rows "
                         "are too few to rebuild the ledger from: pass --restart to replace it, or "
                         "--ledger PATH to "
                         "name its ledger")
    # Remembered: this ledger's identity is the run that rebuilt it, not what made the rows
    # (--retry-errors asks).
    ledger.set_meta("rebuilt_from_output", why)
    if rec.rows:  # JSONL (or a Parquet run's staging file): _reconcile adopts every row
        rows = rec.rows
    else:                          # a finished Parquet output: its index column says it all
        rows = _mark_parquet_written(ledger, output)
        ledger.set_meta("finalized", "parquet")
    return (f"the ledger {led} was {why}: rebuilt it from the {rows:,} rows of "
            f"{display_path(output)}, which hold "
            "every input line once (nothing is generated again; which function and input made them "
            "cannot be "
            "checked — pass --restart to make them again)")


def _complete(rec: Reconciliation, output: Path, total: int) -> bool:
    if rec.rows:
        return (
            rec.rows == total
            and not rec.duplicates
            and not rec.tail_bytes
            and rec.foreign_at is None
            and not rec.beyond
            and rec.present.max() < total
        )
    if is_parquet(output) and output.exists() and not rec.size:
        return _parquet_indices_complete(output, total)
    return False


def _parquet_indices_complete(path: Path, total: int) -> bool:
    seen = bytearray(total)
    try:
        for indices, _ in parquet_out.iter_index_column(path):
            for i in indices:
                if not (isinstance(i, int) and 0 <= i < total) or seen[i]:
                    return False
                seen[i] = 1
    except ForgeError:
        return False
    return all(seen)


def _mark_parquet_written(ledger: Ledger, path: Path) -> int:
    n = 0
    for indices, errors in parquet_out.iter_index_column(path):
        for start in range(0, len(indices), _CHUNK):
            ledger.apply(
                written=list(zip(indices[start : start + _CHUNK], errors[start : start + _CHUNK]))
            )
        n += len(indices)
    return n
