"""Read input records lazily, one `(index, record | InputError)` at a time, in bounded memory.

JSONL: every input line is one index (0-based), so line numbers in error rows stay honest; a line
that is empty, not UTF-8, not JSON, not an object, or over MAX_INPUT_LINE_BYTES becomes an
InputError for that index and the run goes on. Parquet (when pyarrow is installed): every row is
one index, read in row batches."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from forge import constants
from forge.errors import ForgeError, display_path

PARQUET_SUFFIXES = (".parquet", ".pq")
_SCAN_CHUNK_BYTES = 1 << 20
_PARQUET_BATCH_ROWS = 1024


def is_parquet(path: Path) -> bool:
    """A file read or written as Parquet (by its suffix); any other is JSONL."""
    return path.suffix.lower() in PARQUET_SUFFIXES


@dataclass(frozen=True)
class InputError:
    """A record that could not be read; written to the output as an error row for its index."""

    type: str
    message: str


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every line: json.loads with a keyword builds a new JSONDecoder (and its scanner)
# per call, about a third of the reader's time per record (docs/benchmarks.md, "Control plane").
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_line(raw: bytes, shown: str, index: int, max_bytes: int) -> dict | InputError:
    """`shown`:`index + 1` names the line in an error; the string is only built when there is
    one."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) > max_bytes:
        return InputError("InputTooLarge", f"{shown}:{index + 1}: line is over the "
                                           f"{max_bytes}-byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return InputError("InputNotUTF8", f"{shown}:{index + 1}: not valid UTF-8 at byte {e.start}")
    if not text or text.isspace():          # what `not text.strip()` says, without copying the line
        return InputError("InputEmptyLine", f"{shown}:{index + 1}: empty line")
    try:
        # json.loads' own check first: a byte-order mark inside the file is refused with its
        # message.
        value = json.loads(text) if text.startswith("\ufeff") else _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        return InputError("InputInvalidJSON", f"{shown}:{index + 1}: not valid JSON: {e}")
    if not isinstance(value, dict):
        return InputError("InputNotObject",
                          f"{shown}:{index + 1}: expected a JSON object, got {_json_kind(value)}")
    return value


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return {list: "an array", str: "a string", int: "a number", float: "a number"}[type(value)]


class RecordSource:
    """One input file. Iterate it (or call `records(skip=...)`) for `(index, record |
    InputError)`."""

    def __init__(self, path: Path, fmt: str, *, max_line_bytes: int) -> None:
        self.path = path
        self.format = fmt                      # "jsonl" | "parquet"
        self.max_line_bytes = max_line_bytes
        self._shown = display_path(path)

    def __iter__(self) -> Iterator[tuple[int, dict | InputError]]:
        return self.records()

    def records(
        self, skip: Callable[[int], bool] | None = None
    ) -> Iterator[tuple[int, dict | InputError]]:
        """Every index in order; indices where `skip(index)` is true are not decoded nor yielded
        (a resumed run skips what is already settled without parsing it)."""
        if self.format == "parquet":
            return self._parquet_records(skip)
        return self._jsonl_records(skip)

    def count(self) -> int:
        """Number of records, cheaply: a newline byte scan (JSONL) or the file footer (Parquet)."""
        if self.format == "parquet":
            with open(self.path, "rb") as source:
                return _parquet_file(self.path, source).metadata.num_rows
        lines, last = 0, b"\n"
        with self._open_bytes() as f:
            while chunk := f.read(_SCAN_CHUNK_BYTES):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        return lines + (last != b"\n")  # a last line without a newline is a line too

    def fingerprint(self) -> dict[str, object]:
        """Identity of the input for the ledger: size and a hash of its first and last MiB.
        (mtime is left out on purpose: copying the file must not break a resume.)"""
        size = self.path.stat().st_size
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            h.update(f.read(_SCAN_CHUNK_BYTES))
            if size > 2 * _SCAN_CHUNK_BYTES:
                f.seek(size - _SCAN_CHUNK_BYTES)
            h.update(f.read(_SCAN_CHUNK_BYTES))
        return {"input_size": size, "input_sha256_head_tail": h.hexdigest()}

    def _open_bytes(self):
        """The JSONL bytes as a binary file (a compressed shard or a pipe opens differently:
        forge/records/shards.py)."""
        return open(self.path, "rb")

    def _jsonl_records(
        self, skip: Callable[[int], bool] | None
    ) -> Iterator[tuple[int, dict | InputError]]:
        limit = self.max_line_bytes + 2  # room for "\r\n" on a line of exactly the limit
        with self._open_bytes() as f:
            index = 0
            while raw := f.readline(limit + 1):
                if len(raw) > limit and not raw.endswith(b"\n"):
                    _discard_rest_of_line(f)  # never hold an oversized line in memory
                if index == 0 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark is not part of the first record
                if skip is None or not skip(index):
                    yield index, _decode_line(raw, self._shown, index, self.max_line_bytes)
                index += 1

    def _parquet_records(
        self, skip: Callable[[int], bool] | None
    ) -> Iterator[tuple[int, dict | InputError]]:
        """Row group by row group: a group that cannot be decoded (a damaged page, its footer
        intact) fails the records it holds, each an InputUnreadable row, and the next group is
        read."""
        with open(self.path, "rb") as source:
            yield from self._parquet_groups(_parquet_file(self.path, source), skip)

    def _parquet_groups(
        self, f, skip: Callable[[int], bool] | None
    ) -> Iterator[tuple[int, dict | InputError]]:
        index = 0
        for group in range(f.metadata.num_row_groups):
            end = index + f.metadata.row_group(group).num_rows
            try:
                for batch in f.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group]):
                    n = batch.num_rows
                    if skip is not None and all(skip(i) for i in range(index, index + n)):
                        index += n  # a wholly settled batch is not converted to Python objects
                        continue
                    for row in batch.to_pylist():
                        if skip is None or not skip(index):
                            yield index, row
                        index += 1
            except Exception as e:  # noqa: BLE001 - pyarrow's OSError/ArrowInvalid for bytes it cannot decode
                why = " ".join(f"{type(e).__name__}: {e}".split())[:500]
                error = InputError("InputUnreadable", f"{self._shown}: row group {group} (records "
                                                      f"{index + 1} to "
                                   f"{end}) cannot be read: {why}")
                for i in range(index, end):
                    if skip is None or not skip(i):
                        yield i, error
            index = end


def _discard_rest_of_line(f) -> None:
    while chunk := f.readline(_SCAN_CHUNK_BYTES):
        if chunk.endswith(b"\n"):
            return


def _parquet_file(path: Path, source):
    """`source`: `path` opened for reading. pyarrow is handed the file object, never the path, which
    it encodes as UTF-8 (a shard whose name is not UTF-8 would fail there)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ForgeError(f"{display_path(path)}: reading Parquet needs pyarrow "
                         "(pip install 'forge-llm[parquet]')") from None
    try:
        return pq.ParquetFile(source)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a file that is not Parquet
        raise ForgeError(f"{display_path(path)}: not a readable Parquet file: {e}") from None


def open_records(
    path: str | os.PathLike, *, max_line_bytes: int = constants.MAX_INPUT_LINE_BYTES
) -> RecordSource:
    """Open an input file (format from the suffix: .parquet/.pq, else JSONL). Refuses a missing
    or unreadable file with one clear line."""
    p = Path(path)
    shown = display_path(p)
    if not p.exists():
        raise ForgeError(f"{shown}: input file does not exist")
    if not p.is_file():
        raise ForgeError(f"{shown}: input is not a regular file")
    if not os.access(p, os.R_OK):
        raise ForgeError(f"{shown}: input file is not readable")
    fmt = "parquet" if is_parquet(p) else "jsonl"
    source = RecordSource(p, fmt, max_line_bytes=max_line_bytes)
    if fmt == "parquet":
        with open(p, "rb") as f:
            _parquet_file(p, f)  # refuse a missing pyarrow or a broken file now, not mid-run
    return source
