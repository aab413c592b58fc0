"""The JSONL output: row encoding, a locked append-only writer, and reconciliation on resume.

Every row is one line, `{"index": i, "result": ...}` or `{"index": i, "error": {"type",
"message"}}`. Lines are appended with one write per batch and made durable with fsync; a line
without its newline (or zero bytes after a power loss) can only be an unsynced tail from a crash and
is cut off on resume, once the ledger has shown the file to be this run's; anything else is not
forge's and is never cut."""
from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from forge import constants
from forge.errors import ForgeError, display_path
from forge.records.bitmap import IndexBitmap
from forge.records.guard import is_torn_tail, require_regular_or_absent

MAX_ERROR_MESSAGE_CHARS = 8192      # an exception that quotes a whole prompt is cut here
_CHUNK_BYTES = 1 << 20
_TORN_HEAD = re.compile(rb'\{"index": (0|[1-9]\d{0,18})\D')
# At most 19 digits: an index is an int64, and a longer run of digits is never turned into an int
# here.
_ROW_HEAD = re.compile(rb'\{"index": (0|[1-9]\d{0,18}), "(result|error)": ')


def valid_text(text: str) -> str:
    """`text` as valid Unicode, writable as UTF-8 (JSON, Parquet): a lone surrogate (an undecodable
    byte of a file name read through surrogateescape, an exception message holding one) becomes its
    escape as plain text (`\\udcff`, the byte stays recognisable). Anything else is returned as it
    is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def encode_error(index: int, type_: str, message: str) -> str:
    """An error row. Its strings are made valid text first (valid_text), so the row is strict JSON
    whatever the message held, and a Parquet output can hold it."""
    message = str(message)
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[:MAX_ERROR_MESSAGE_CHARS] + " ... (truncated)"
    body = json.dumps({"type": valid_text(str(type_)), "message": valid_text(message)})
    return f'{{"index": {int(index)}, "error": {body}}}'


# One encoder for every row: json.dumps with keywords builds a new JSONEncoder per call
# (docs/benchmarks.md, "Control plane"); encode() gives the same text.
_RESULT_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def encode_result(index: int, result: object, *,
                  max_bytes: int = constants.MAX_OUTPUT_ROW_BYTES) -> tuple[str, bool]:
    """(row line without newline, is_error). A result that is not strict JSON (objects, NaN, lone
    surrogates, cycles, a container whose own methods raise) becomes a SerializationError row, and
    one whose row would be over `max_bytes` a ResultTooLarge row: that record's error, never a run
    that cannot finish."""
    try:
        body = _RESULT_ENCODER.encode(result)
        # lone surrogates pass dumps but cannot be written as UTF-8
        size = len(body.encode("utf-8"))
    except MemoryError:
        return encode_error(
            index, "ResultTooLarge", "result is too large to encode in memory"
        ), True
    except Exception as e:  # noqa: BLE001 - whatever the result's own code raises while it is encoded
        return encode_error(
            index,
            "SerializationError",
            f"result is not JSON-serializable: {type(e).__name__}: {_describe(e)}",
        ), True
    if size + 64 > max_bytes:
        return encode_error(index, "ResultTooLarge", f"the result is {size:,} bytes as JSON, over "
                                                     "the limit of "
                            f"{max_bytes:,} bytes for one output row "
                            "(constants.MAX_OUTPUT_ROW_BYTES)"), True
    return f'{{"index": {int(index)}, "result": {body}}}', False


def _describe(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - a message that cannot be printed is described instead
        return "(its message cannot be printed)"


@dataclass
class Reconciliation:
    """What an existing output file holds. `scan()` fills it without changing the file;
    `reconcile()` also cuts the torn tail off."""

    present: IndexBitmap = field(default_factory=IndexBitmap)
    errors: IndexBitmap = field(default_factory=IndexBitmap)     # of those, error rows
    rows: int = 0
    truncated_bytes: int = 0
    duplicates: int = 0
    first_duplicates: list[int] = field(default_factory=list)   # at most 10, for the message
    size: int = 0                   # bytes in the file when scanned
    good_end: int = 0               # end of the last complete forge row
    # byte where content begins that no forge run writes (None: all ours)
    foreign_at: int | None = None
    # rows whose index is past the input (`total`): counted, never held in `present`
    beyond: int = 0
    first_beyond: int | None = None
    torn_index: int | None = None   # the index the torn tail's row began with, when it got that far

    @property
    def tail_bytes(self) -> int:
        """Bytes after the last complete row: a torn row left by a kill (or zeros after a power
        loss)."""
        return self.size - self.good_end


class OutputWriter:
    """Append-only JSONL output, exclusively locked (flock) so two runs never share one file."""

    def __init__(self, path: str | os.PathLike, *, follow_links: bool = True) -> None:
        """`follow_links`: an existing symlink to a regular file may be opened (an --output the user
        named); never a dangling one (forge would create its target), and never any link where it is
        False (a staging file)."""
        self.path = Path(path)
        self._shown = display_path(self.path)
        self.created = False            # this writer made the file (a refused run removes it again)
        if os.path.islink(self.path) and (not follow_links or not os.path.exists(self.path)):
            raise ForgeError(f"{self._shown}: is a symbolic link; forge writes the rows of a run "
                             "only into a file "
                             "it creates there, never through a link: remove the link or choose "
                             "another --output")
        require_regular_or_absent(self.path, "the output")
        flags = os.O_WRONLY | os.O_APPEND | (0 if follow_links else os.O_NOFOLLOW)
        try:
            try:
                self._fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                self.created = True
            except FileExistsError:
                self._fd = os.open(self.path, flags)
        except OSError as e:
            raise ForgeError(
                f"{self._shown}: cannot open the output for writing: {e.strerror}"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise ForgeError(f"{self._shown}: another forge run is writing this output") from None
        # where forge's bytes end: the file is never shorter (lost())
        self._end = os.fstat(self._fd).st_size

    def append(self, lines: list[str]) -> int:
        """Append rows (no newline in them) with one write; not durable until sync(). Returns
        bytes."""
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        view, written = memoryview(data), 0
        while written < len(data):
            written += os.write(self._fd, view[written:])
        self._end += written
        return written

    def sync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int = 0) -> None:
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        self._end = size

    def lost(self) -> str | None:
        """Why the file this writer appends to is no longer the output, or None while it is. Rows
        appended to a file deleted, moved away or replaced under the output's name, or to one cut
        below what forge wrote, are not in the output: nothing may be marked written then."""
        held = os.fstat(self._fd)
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return (
                "was deleted during the run"
                if held.st_nlink == 0
                else "was moved away during the run"
            )
        except OSError as e:
            return f"cannot be checked any more ({e.strerror})"
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return "was replaced by another file during the run"
        if held.st_size < self._end:
            return (f"was cut short during the run ({held.st_size:,} bytes where forge had written "
                    f"{self._end:,})")
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing releases the flock
            self._fd = -1

    def remove_if_created_empty(self) -> None:
        """After a refusal: the empty file this writer created goes again (nothing else's is
        touched)."""
        try:
            if self.created and os.lstat(self.path).st_size == 0:
                os.unlink(self.path)
        except OSError:
            pass

    def scan(self, total: int | None = None) -> Reconciliation:
        """Read what the output holds (indices, error rows, duplicates, a torn tail) without
        changing it. Content no forge run can leave (another file's lines, garbage before good rows)
        sets `foreign_at`. `total`: the input's record count; a row with an index at or past it is
        counted in `beyond` and never set in the bitmap (an index of 10**15 would size it at 125
        TB)."""
        rec = Reconciliation()
        bad_start = None
        with open(self.path, "rb") as f:
            offset = 0
            while head := f.readline(_CHUNK_BYTES):   # a whole line, unless it is over 1 MiB
                start, offset = offset, offset + len(head)
                complete = head.endswith(b"\n")
                while not complete and (chunk := f.readline(_CHUNK_BYTES)):
                    offset += len(chunk)
                    complete = chunk.endswith(b"\n")
                parsed = _parse_row(head, f, start, offset) if complete else None
                if parsed is None:
                    bad_start = start if bad_start is None else bad_start
                    continue
                if bad_start is not None:  # garbage followed by good rows is not a torn tail
                    rec.foreign_at = bad_start
                    return rec
                index, is_error = parsed
                rec.good_end = offset
                if total is not None and index >= total:
                    rec.beyond += 1
                    rec.first_beyond = index if rec.first_beyond is None else rec.first_beyond
                    continue
                if not rec.present.add(index):
                    rec.duplicates += 1
                    if len(rec.first_duplicates) < 10:
                        rec.first_duplicates.append(index)
                    continue
                rec.rows += 1
                if is_error:
                    rec.errors.add(index)
            rec.size = offset
            if rec.tail_bytes:
                if not is_torn_tail(f, rec.good_end):
                    rec.foreign_at = rec.good_end
                else:
                    f.seek(rec.good_end)
                    m = _TORN_HEAD.match(f.read(64).lstrip(b"\x00"))
                    rec.torn_index = int(m.group(1)) if m else None
        return rec

    def cut_tail(self, rec: Reconciliation) -> None:
        """Cut the torn tail `scan()` found (only once the ledger has shown the output to be this
        run's)."""
        if rec.foreign_at is not None:
            raise ForgeError(f"{self._shown}: byte {rec.foreign_at}: not a forge output row")
        if rec.tail_bytes:
            self.truncate(rec.good_end)
            rec.truncated_bytes = rec.tail_bytes

    def reconcile(self) -> Reconciliation:
        """scan(), refuse content forge did not write, cut the torn tail."""
        rec = self.scan()
        if rec.foreign_at is not None:
            raise ForgeError(f"{self._shown}: byte {rec.foreign_at}: not a forge output row; the "
                             "output "
                             "was changed outside forge (pass --restart to start over)")
        self.cut_tail(rec)
        return rec


def _parse_row(head: bytes, f, start: int, end: int) -> tuple[int, bool] | None:
    """(index, is_error) of one complete line, or None when it is not a forge row."""
    m = _ROW_HEAD.match(head)
    if m:  # our own encoding: the index is the first key, so the body need not be parsed
        return int(m.group(1)), m.group(2) == b"error"
    here = f.tell()
    f.seek(start)
    raw = f.read(end - start)
    f.seek(here)
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if (not isinstance(row, dict) or type(row.get("index")) is not int or row["index"] < 0
            or len(row) != 2 or not ({"result", "error"} & row.keys())):
        return None
    return row["index"], "error" in row
