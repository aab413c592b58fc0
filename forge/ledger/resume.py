"""Opening a run: reconcile the output with the ledger, then hand the runner what is left to do.

The protocol (docs/ledger.md has the proof sketch):
  1. open the ledger (identity checked; --restart resets it) and lock the output;
  2. cut a torn tail off the output and read which indices it holds;
  3. refuse an output the ledger cannot explain (rows without a ledger, rows the ledger wrote
     that are gone, indices beyond the input);
  4. mark 'written' what the output holds but the ledger had not marked yet (killed between the
     fsync and the mark);
  5. write out, without regenerating, rows settled in the ledger but absent from the output;
  6. the runner then processes only indices not in `Run.settled`."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ForgeError, display_path
from forge.ledger.committer import Committer
from forge.ledger.sqlite import Ledger, LedgerCounts
from forge.records import parquet_out
from forge.records.bitmap import IndexBitmap
from forge.records.reader import PARQUET_SUFFIXES, InputError, RecordSource
from forge.records.writer import OutputWriter, encode_error, encode_result

_CHUNK = 2048


def default_ledger_path(output: str | os.PathLike) -> Path:
    output = Path(output)
    return output.with_name(output.name + ".ledger.sqlite")


def staging_path(output: Path) -> Path:
    """Where rows go as they are made: the output itself (JSONL) or a JSONL beside a Parquet output."""
    return output.with_name(output.name + ".staging.jsonl") if _is_parquet(output) else output


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
    duplicates: int = 0            # rows present twice in the output (never expected)
    first_duplicates: tuple[int, ...] = ()
    complete: bool = False         # nothing left to do


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

    def start_attempt(self, index: int) -> None:
        """Count a function invocation for `index` (batched; retries show up as attempts > 1)."""
        self._committer().put_attempt(index)

    def put_result(self, index: int, result: object) -> None:
        line, is_error = encode_result(index, result)
        self._committer().put_row(index, line, is_error)

    def put_error(self, index: int, type_: str, message: str) -> None:
        self._committer().put_row(index, encode_error(index, type_, message), True)

    def put_input_error(self, index: int, error: InputError) -> None:
        self.put_error(index, error.type, error.message)

    async def aput_attempt(self, index: int) -> None:
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
            self._closed = True
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.ledger.close()
        return self.report

    def _finish_parquet(self) -> None:
        if not _is_parquet(self.output) or not self.report.complete:
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
             info: dict[str, object] | None = None, accept_changes: tuple[str, ...] = ()) -> Run:
    """Open (or resume) the run writing `output` over an input of `total` records. `run_key` must
    match the ledger's (make_run_key) but for the keys in `accept_changes`; `info` is recorded only."""
    output = Path(output)
    if _is_parquet(output):
        parquet_out.require_parquet()
    ledger = Ledger(ledger_path or default_ledger_path(output), run_key=run_key, restart=restart, info=info,
                    accept_changes=accept_changes)
    try:
        if restart and _is_parquet(output):
            output.unlink(missing_ok=True)
        elif ledger.get_meta("finalized"):
            return _finished_run(ledger, output, total)
        writer = OutputWriter(staging_path(output))
        try:
            if restart:
                writer.truncate(0)
            settled, report = _reconcile(ledger, writer, total)
        except BaseException:
            writer.close()
            raise
    except BaseException:
        ledger.close()
        raise
    report.complete = len(settled) == total
    return Run(ledger, writer, output, total, settled, report)


def _reconcile(ledger: Ledger, writer: OutputWriter, total: int) -> tuple[IndexBitmap, ResumeReport]:
    shown = display_path(writer.path)
    rec = writer.reconcile()
    report = ResumeReport(resumed=not ledger.fresh, already_written=rec.rows, truncated_bytes=rec.truncated_bytes,
                          duplicates=rec.duplicates, first_duplicates=tuple(rec.first_duplicates))
    if ledger.fresh and rec.rows:
        raise ForgeError(f"{shown}: the output already holds {rec.rows} rows but its ledger "
                         f"{display_path(ledger.path)} is new; pass --restart to overwrite it, "
                         "or --ledger PATH to name the run's ledger")
    if rec.present.max() >= total:
        raise ForgeError(f"{shown}: has a row for index {rec.present.max()} but the input has only "
                         f"{total} records; pass --restart to start over")
    ledger_written = ledger.indices("written")
    lost = ledger_written.difference(rec.present)
    if lost:
        raise ForgeError(f"{shown}: {len(lost)} rows the ledger recorded as written are missing (first: index "
                         f"{next(iter(lost))}); the output was changed outside forge; pass --restart to start over")
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


def _finished_run(ledger: Ledger, output: Path, total: int) -> Run:
    if not output.exists():
        raise ForgeError(f"{display_path(output)}: this run was completed by ledger "
                         f"{display_path(ledger.path)} but the output is gone; pass --restart to redo it")
    staging_path(output).unlink(missing_ok=True)  # left behind by a kill right after finalizing
    settled = ledger.indices("written")
    report = ResumeReport(resumed=True, already_written=len(settled), complete=True)
    return Run(ledger, None, output, total, settled, report)


def _is_parquet(output: Path) -> bool:
    return output.suffix.lower() in PARQUET_SUFFIXES
