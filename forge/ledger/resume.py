"""Opening a run: reconcile the output with the ledger, then hand the runner what is left to do.

The protocol (docs/ledger.md has the proof sketch):
  1. refuse to write over the input, or over a file that is not forge output; lock the output and
     read which indices it holds (nothing is changed yet);
  2. open the ledger (identity checked; --restart resets it, and only then empties the output);
  3. refuse an output the ledger cannot explain (rows without a ledger, another output's ledger, rows
     the ledger wrote that are gone, indices beyond the input);
  4. cut a torn tail; mark 'written' what the output holds but the ledger had not marked yet (killed
     between the fsync and the mark);
  5. write out, without regenerating, rows settled in the ledger but absent from the output;
  6. the runner then processes only indices not in `Run.settled`."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError, display_path
from forge.ledger.committer import OUTPUT_LOST, Committer
from forge.ledger import recovery
from forge.ledger.damage import LedgerDamaged
from forge.ledger.sqlite import Ledger, LedgerCounts
from forge.records import parquet_out
from forge.records.bitmap import IndexBitmap
from forge.records.guard import (parquet_is_forge_output, refuse_foreign, refuse_overlaps,
                                 require_regular_or_absent)
from forge.records.reader import RecordSource, is_parquet
from forge.records.writer import OutputWriter, Reconciliation, encode_error, encode_result

_CHUNK = 2048


def default_ledger_path(output: str | os.PathLike) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".ledger.sqlite")


def staging_path(output: Path) -> Path:
    """Where rows go as they are made: the output itself (JSONL) or a JSONL beside a Parquet
    output."""
    return output.with_name(output.name + ".staging.jsonl") if is_parquet(output) else output


def make_run_key(*, function_file: str | os.PathLike, function_name: str, source: RecordSource,
                 **extra: object) -> dict[str, object]:
    """The identity a resume must match: the function's file content and name, and the input's
    size + head/tail hash. (Modules the function file imports are not hashed.)"""
    digest = hashlib.sha256(Path(function_file).read_bytes()).hexdigest()
    return {"function": f"{Path(function_file).name}:{function_name}", "function_sha256": digest,
            **source.fingerprint(), **extra}


@dataclass
class ResumeReport:
    resumed: bool = False          # the ledger already knew this run
    already_written: int = 0       # rows in the output before this start (not redone)
    adopted: int = 0               # of those, rows the ledger had not yet marked written
    recovered: int = 0             # rows from the ledger written now, without regenerating them
    truncated_bytes: int = 0       # torn tail cut off the output
    # rows the ledger marked written that a cut end of the output lost: made again
    regenerated: int = 0
    # an earlier start found the output deleted, replaced or cut: why (regenerated)
    lost_why: str = ""
    duplicates: int = 0            # rows present twice in the output (never expected)
    first_duplicates: tuple[int, ...] = ()
    complete: bool = False         # nothing left to do
    # the ledger was missing or damaged and was rebuilt from the output: what happened
    rebuilt: str = ""


class Run:
    """A run's ledger + output. Skip `settled` indices; hand every other index exactly one row."""

    def __init__(self, ledger: Ledger, writer: OutputWriter | None, output: Path, total: int,
                 settled: IndexBitmap, report: ResumeReport) -> None:
        self.ledger, self.output, self.total = ledger, output, total
        self.settled, self.report = settled, report
        self.stats = ledger.stats
        self._writer = writer
        self._closed = False
        self._final_counts: LedgerCounts | None = None
        self.committer = Committer(ledger, writer) if writer is not None else None

    def is_settled(self, index: int) -> bool:
        return index in self.settled

    async def aput_attempt(self, index: int) -> None:
        """Count a function invocation for `index` (batched; retries show up as attempts > 1)."""
        await self._committer().aput_attempt(index)

    async def aput_result(self, index: int, result: object) -> bool:
        """False when the result could not be serialised and went in as an error row instead."""
        line, is_error = encode_result(index, result)
        await self._committer().aput_row(index, line, is_error)
        return not is_error

    async def aput_error(self, index: int, type_: str, message: str) -> None:
        await self._committer().aput_row(index, encode_error(index, type_, message), True)

    def counts(self) -> LedgerCounts:
        """The ledger's counts; after close(), as they were at close."""
        return self._final_counts if self._final_counts is not None else self.ledger.counts()

    def close(self) -> ResumeReport:
        """Drain and close. A complete Parquet run is converted now and its staging file removed.
        Call it on every exit (also Ctrl-C): what was handed over is then committed and written."""
        if self._closed:
            return self.report
        try:
            if self.committer is not None:
                self.committer.close()
            self._final_counts = self.ledger.counts()
            self.report.complete = self._final_counts.written == self.total
            if self.committer is not None:
                self._finish_parquet()
                if self.report.complete:
                    self.ledger.compact()
        finally:
            # Released either way: a second close (the job's own, on every exit) is a no-op, not the
            # first one's failure (a full disk) raised again as an internal error.
            self._closed = True
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.ledger.close()
        return self.report

    def _finish_parquet(self) -> None:
        if not is_parquet(self.output) or not self.report.complete:
            return
        staging = staging_path(self.output)
        parquet_out.jsonl_to_parquet(staging, self.output)
        self.ledger.set_meta("finalized", "parquet")
        staging.unlink(missing_ok=True)

    def _committer(self) -> Committer:
        if self.committer is None:
            raise ForgeError(f"{display_path(self.output)}: this run is already complete")
        return self.committer

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_run(output: str | os.PathLike, *, run_key: dict[str, object], total: int,
             ledger_path: str | os.PathLike | None = None, restart: bool = False,
             info: dict[str, object] | None = None, input_path: str | os.PathLike | None = None,
             accept_changes: tuple[str, ...] = ()) -> Run:
    """Open (or resume) the run writing `output` over an input of `total` records. `run_key` must
    match the ledger's (make_run_key) but for the keys in `accept_changes`; `info` is recorded only
    (node, input path, ...).

    Nothing is written over a file forge did not write: the input (by path or through a link), a
    file whose content is not forge rows, forge rows no ledger records writing (unless `restart`). A
    damaged or lost ledger is rebuilt from the output when the output is complete (recovery.py);
    else refused, saying how."""
    output = Path(output)
    ledger_path = Path(ledger_path) if ledger_path is not None else default_ledger_path(output)
    parquet = is_parquet(output)
    refuse_overlaps({"--input": _opt_path(input_path), "--output": output,
                     "the Parquet staging file": staging_path(output) if parquet else None,
                     "the ledger": ledger_path})
    if parquet:
        parquet_out.require_parquet()
        _check_parquet_target(output)
    # locks the output: nothing else writes it from here. A Parquet run's staging file is forge's
    # alone: never a link.
    writer = OutputWriter(staging_path(output), follow_links=not parquet)
    try:
        rec = writer.scan(total)
        if rec.foreign_at is not None:
            raise refuse_foreign(writer.path, f"byte {rec.foreign_at} is not a forge output row")
        args = dict(
            output=output,
            ledger_path=ledger_path,
            run_key=run_key,
            total=total,
            restart=restart,
            info=info,
            accept_changes=accept_changes,
        )
        try:
            return _open(writer, rec, **args)
        except LedgerDamaged as damaged:
            # Set aside (never deleted) when --restart discards it anyway or the output can replace
            # it; else refused with what to do. Then a new ledger, rebuilt from the output by the
            # lost-ledger path.
            rec = writer.scan(total)
            why = recovery.set_aside_damaged(
                damaged, ledger_path, output, rec, total, restart=restart
            )
            return _open(writer, rec, **args, rebuild_why=why)
    except BaseException:
        writer.close()
        writer.remove_if_created_empty()        # a refused run leaves no output behind
        raise


def _open(
    writer: OutputWriter,
    rec: Reconciliation,
    *,
    output: Path,
    ledger_path: Path,
    run_key: dict[str, object],
    total: int,
    restart: bool,
    info: dict[str, object] | None,
    accept_changes: tuple[str, ...] = (),
    rebuild_why: str = "",
) -> Run:
    ledger_was_there = _nonempty(ledger_path)
    ledger = Ledger(
        ledger_path,
        run_key=run_key,
        restart=restart,
        info=info,
        accept_changes=accept_changes,
        owner=_owner(output),
    )
    try:
        if ledger.get_meta("finalized"):
            writer.close()
            return _finished_run(ledger, output, total)
        _check_ledger_output(ledger, output)
        rebuilt = ""
        if restart:
            if is_parquet(output):
                output.unlink(missing_ok=True)      # forge's own (its columns were checked above)
            writer.truncate(0)
            rec = Reconciliation()
            if rebuild_why:
                rebuilt = (f"the ledger {display_path(ledger_path)} was {rebuild_why}; --restart "
                           "starts over")
        elif ledger.fresh and (rec.size or (is_parquet(output) and output.exists())):
            # rows no ledger records: this run's only if they are all of it (a lost or damaged
            # ledger)
            rebuilt = recovery.rebuild_or_refuse(ledger, writer.path, rec, output, total,
                                                 why=rebuild_why or "missing")
            if ledger.get_meta("finalized"):  # a complete Parquet output: nothing left to write
                writer.close()
                run = _finished_run(ledger, output, total)
                run.report.rebuilt = rebuilt
                return run
        settled, report = _reconcile(ledger, writer, rec, total)
        report.rebuilt = rebuilt
    except BaseException:
        ledger.close()
        # a ledger made here for a run refused here: a rerun must not find it
        if not ledger_was_there:
            _remove_ledger(ledger_path)
        raise
    report.complete = len(settled) == total
    return Run(ledger, writer, output, total, settled, report)


def _opt_path(p: str | os.PathLike | None) -> Path | None:
    return None if p is None else Path(p)


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _remove_ledger(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


def _check_parquet_target(output: Path) -> None:
    """An existing Parquet output is replaced when the run completes: it must be forge's."""
    if not output.exists() and not output.is_symlink():
        return
    require_regular_or_absent(output, "the output")
    if not parquet_is_forge_output(output):
        raise refuse_foreign(output, "not a Parquet file with forge's columns")


def _owner(output: Path) -> str:
    return json.dumps(output.name)      # JSON: any file name, even not UTF-8


def _check_ledger_output(ledger: Ledger, output: Path) -> None:
    """A ledger records which output it writes: another output's ledger (--ledger) is refused (the
    Ledger refuses it before a --restart could reset it; here it is recorded on a new ledger)."""
    if ledger.get_meta("output") is None:
        ledger.set_meta("output", _owner(output))


def _reconcile(ledger: Ledger, writer: OutputWriter, rec: Reconciliation,
               total: int) -> tuple[IndexBitmap, ResumeReport]:
    """`rec`: the output's scan. Refuse what the ledger cannot explain, then (only then) cut the
    torn tail, adopt rows the ledger had not marked and write the rows it settled but the output
    lacks."""
    shown = display_path(writer.path)
    report = ResumeReport(resumed=not ledger.fresh, already_written=rec.rows,
                          duplicates=rec.duplicates, first_duplicates=tuple(rec.first_duplicates))
    if rec.beyond or rec.present.max() >= total:
        first = rec.first_beyond if rec.first_beyond is not None else rec.present.max()
        raise ForgeError(f"{shown}: has a row for index {first} but the input has only "
                         f"{total} records; pass --restart to start over")
    ledger_written = ledger.indices("written")
    lost = ledger_written.difference(rec.present)
    lost_why = ledger.get_meta(OUTPUT_LOST) or ""
    if lost and (lost_why or _cut_short(rec, lost)):
        # The output ends in a torn row and lost rows the ledger marked written: it was cut short (a
        # copy or a disk that lost its end); or an earlier start saw it deleted, replaced or cut
        # while it wrote (the ledger says so). Those rows are no longer in the ledger either (it
        # keeps a row only until it is written), so they are made again; every row still in the
        # output is kept.
        ledger.forget(lost)
        report.regenerated, report.lost_why = len(lost), lost_why
        ledger_written = ledger_written.difference(lost)
        lost = IndexBitmap()
    if lost:
        raise ForgeError(f"{shown}: {len(lost)} rows the ledger recorded as written are missing "
                         "(first: index "
                         f"{next(iter(lost))}); the output was changed outside forge; pass "
                         "--restart to start over")
    writer.cut_tail(rec)
    report.truncated_bytes = rec.truncated_bytes
    if lost_why:
        ledger.set_meta(OUTPUT_LOST, "")        # handled: the ledger and the output agree again
    adopt = rec.present.difference(ledger_written)
    del ledger_written, lost
    batch: list[tuple[int, bool]] = []
    for i in adopt:
        batch.append((i, i in rec.errors))
        if len(batch) >= _CHUNK:
            ledger.apply(written=batch)
            report.adopted += len(batch)
            batch = []
    if batch:
        ledger.apply(written=batch)
        report.adopted += len(batch)
    settled = rec.present
    for rows in ledger.unwritten_rows(_CHUNK):
        writer.append([row for _, row, _ in rows])
        writer.sync()
        ledger.apply(written=[(i, err) for i, _, err in rows])
        for i, _, _ in rows:
            settled.add(i)
        report.recovered += len(rows)
    return settled, report


def _cut_short(rec: Reconciliation, lost: IndexBitmap) -> bool:
    """Rows gone from the end only: a torn tail (the row cut mid-way), and that row one of those
    lost."""
    return (
        bool(rec.tail_bytes)
        and rec.foreign_at is None
        and (rec.torn_index is None or rec.torn_index in lost)
    )


def _finished_run(ledger: Ledger, output: Path, total: int) -> Run:
    if not output.exists():
        raise ForgeError(f"{display_path(output)}: this run was completed by ledger "
                         f"{display_path(ledger.path)} but the output is gone; pass --restart to "
                         "redo it")
    staging_path(output).unlink(missing_ok=True)  # left behind by a kill right after finalizing
    settled = ledger.indices("written")
    report = ResumeReport(resumed=True, already_written=len(settled), complete=True)
    return Run(ledger, None, output, total, settled, report)
