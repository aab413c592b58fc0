"""`--retry-errors`: run again only the records whose rows are error rows, keeping every good row.

The ledger knows which written rows are errors (`is_error`). Their rows leave the output before they
are made again, so the output never holds two rows for one index, and every step leaves files that
the ordinary resume protocol (resume.py) explains:

- JSONL (or a Parquet run's staging file): 1. one ledger transaction makes the error records pending
  again;
  2. the output is copied without their rows to a fresh temp file beside it, fsync'ed and renamed
     over it. Killed
  between 1 and 2, the output still holds the error rows the ledger calls pending: the resume adopts them (the
  output is as it was, and the same command retries them again). Killed after 2: an ordinary resume.
- A finished Parquet output: 1. its good rows are written to the staging file (temp, fsync, rename);
  2. one ledger transaction makes the error records pending and the run no longer finalized. Killed
  between 1 and 2, the ledger still says finalized and the resume removes the staging file (the
  output is as it was). Killed after 2: an ordinary resume, and the Parquet file is replaced
  (atomically) when the run completes.

Which code made the good rows is the ledger's stored function identity (the function file's name,
the function's name, the file's SHA-256) and input identity. A retry keeps good rows only where they
are this function's rows over this input: the same function name in a file of the same name, over
the same input. The file's content may have changed (that is the fix); anything else is refused
before anything changes, as is a ledger rebuilt from its output (it cannot say which function made
the rows)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from forge.atomic import replace_file
from forge.errors import ForgeError, display_path
from forge.ledger.resume import Run, open_run, staging_path
from forge.ledger.sqlite import Ledger
from forge.records import parquet_out
from forge.records.bitmap import IndexBitmap
from forge.records.writer import encode_error

_ROW_HEAD = re.compile(rb'\{"index": (0|[1-9]\d{0,18}), "(?:result|error)": ')
_READ_BYTES = 1 << 20


@dataclass
class Retry:
    run: Run                    # the run, opened again with the error records to do
    error_rows: int             # error rows taken out of the output, to be made again
    kept: int                   # good rows kept as they are
    # "was …, now …" when the function file changed since the good rows were made
    function_changed: str = ""


def open_retry(
    output: str | os.PathLike,
    *,
    ledger_path: str | os.PathLike,
    run_key: dict[str, object],
    **open_args,
) -> Retry:
    """Open the run writing `output` for --retry-errors: its error rows out, their records pending.
    `open_args` are open_run's other arguments (total, info, input_path)."""
    output, ledger_path = Path(output), Path(ledger_path)
    if not _nonempty(ledger_path):
        if _nonempty(output) or _nonempty(staging_path(output)):
            raise ForgeError(f"{display_path(output)}: --retry-errors cannot keep its good rows: "
                             "it has no ledger "
                             f"({display_path(ledger_path)}), so which function and input made "
                             "them cannot be "
                             "checked; --restart makes every row again")
        raise ForgeError(f"{display_path(output)}: --retry-errors has no earlier run to retry (no "
                         "ledger "
                         f"{display_path(ledger_path)}); run without --retry-errors")
    run = open_run(
        output,
        run_key=run_key,
        ledger_path=ledger_path,
        accept_changes=("function_sha256",),
        **open_args,
    )
    try:
        if run.report.rebuilt or run.ledger.get_meta("rebuilt_from_output"):
            raise ForgeError(f"{display_path(output)}: --retry-errors cannot keep its good rows: "
                             "its ledger was "
                             "rebuilt from the output (it was lost or damaged), so which function "
                             "and input made "
                             "them cannot be checked; --restart makes every row again")
        changed = ""
        if run.ledger.accepted:
            changed = f"the function file changed since the rows were made ({run_key['function']})"
        errors = run.ledger.indices("written", errors=True)
        kept = len(run.ledger.indices("written")) - len(errors)
        if errors:
            if run.committer is None:       # a finished Parquet output
                _reopen_parquet(run, output, errors)
            else:
                _reopen_jsonl(run.ledger, staging_path(output), errors)
    except BaseException:
        run.close()
        raise
    if not errors:
        return Retry(run, 0, kept, changed)
    run.close()
    # Opened again from the files as they are now: the ordinary resume protocol, nothing special
    # left to trust.
    return Retry(
        open_run(output, run_key=run_key, ledger_path=ledger_path, **open_args),
        len(errors),
        kept,
        changed,
    )


def _reopen_jsonl(ledger: Ledger, path: Path, errors: IndexBitmap) -> None:
    """The ledger first (killed now, the output still explains itself), then the output without the
    error rows."""
    ledger.reopen(errors)
    # an --output that is a link: the file it names is rewritten
    target = Path(os.path.realpath(path))
    mode = os.stat(target).st_mode & 0o777

    def copy_good_rows(dst) -> None:
        os.fchmod(dst.fileno(), mode)
        with open(target, "rb") as src:
            while line := src.readline(_READ_BYTES):
                while not line.endswith(b"\n") and (more := src.readline(_READ_BYTES)):
                    line += more
                if _index_of(line) not in errors:
                    dst.write(line)

    replace_file(target, copy_good_rows, fsync=True)
    _sync_folder(target.parent)


def _reopen_parquet(run: Run, output: Path, errors: IndexBitmap) -> None:
    """The staging file first, holding the good rows (killed now, the ledger still says finalized
    and the resume removes it), then the ledger."""
    staging = staging_path(output)

    def write_good_rows(dst) -> None:
        for line in _parquet_rows(output, errors):
            dst.write(line.encode("utf-8") + b"\n")

    replace_file(staging, write_good_rows, fsync=True)
    _sync_folder(staging.parent)
    run.ledger.reopen(errors, unfinalize=True)


def _parquet_rows(output: Path, errors: IndexBitmap):
    """The Parquet file's good rows as output lines. A `result_json` column is the row's own JSON
    text; a typed `result` column gives the values as Arrow holds them (a struct's missing keys are
    null, as the file shows)."""
    pa, pq = parquet_out._arrow()
    try:
        f = pq.ParquetFile(output)
        as_json = "result_json" in f.schema_arrow.names
        column = "result_json" if as_json else "result"
        for batch in f.iter_batches(
            batch_size=1024, columns=["index", column, "error_type", "error_message"]
        ):
            cols = batch.to_pydict()
            for i, value, etype, message in zip(cols["index"], cols[column], cols["error_type"],
                                                cols["error_message"]):
                if i in errors:
                    continue
                if etype is not None:  # an error row the ledger does not call one: kept as it is
                    yield encode_error(i, etype, message or "")
                elif as_json:
                    yield f'{{"index": {int(i)}, "result": {value}}}'
                else:
                    yield (f'{{"index": {int(i)}, "result": '
                           f'{json.dumps(value, ensure_ascii=False)}}}')
    except (OSError, pa.ArrowException, KeyError) as e:
        raise ForgeError(
            f"{display_path(output)}: cannot read its rows to retry the errors: {e}"
        ) from None


def _index_of(line: bytes) -> int:
    m = _ROW_HEAD.match(line)
    # the resume checked every row is forge's
    return int(m.group(1)) if m else json.loads(line)["index"]


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)        # the rename itself survives a power loss
    finally:
        os.close(fd)
