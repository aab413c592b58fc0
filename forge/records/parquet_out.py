"""Parquet output, made from the durable JSONL staging file once a run is complete.

Parquet cannot be appended to safely (its footer is written last), so a run always writes JSONL as
it goes and converts at the end. Columns: `index` (int64), `result` (typed: Arrow infers one type
for all results, e.g. a struct of the function's dict), `error_type`, `error_message`. Results whose
types do not unify (a dict here, a string there) go to a `result_json` column of JSON text instead,
and so do results a typed column cannot hold (nested deeper than MAX_TYPED_DEPTH, an int outside
int64, more than MAX_TYPED_FIELDS distinct keys). The file is read back before it replaces the
output. Rows keep completion order; sort by `index` for input order."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from forge.errors import ForgeError, display_path
from forge.records.writer import valid_text

_BATCH_ROWS = 4096
MAX_TYPED_DEPTH = 16  # deeper results go to the JSON column (Parquet readers refuse deep schemas)
MAX_TYPED_FIELDS = 1024     # more distinct keys over all results: the JSON column (see _typed_fits)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _arrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ForgeError("writing Parquet needs pyarrow (pip install 'forge-llm[parquet]'); "
                         "or write JSONL with an --output ending in .jsonl") from None
    return pa, pq


def require_parquet() -> None:
    """Refuse a Parquet output up front (before any work) when pyarrow is missing."""
    _arrow()


def _batches(staging: Path) -> Iterator[list[dict]]:
    rows: list[dict] = []
    with open(staging, "rb") as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) >= _BATCH_ROWS:
                yield rows
                rows = []
    if rows:
        yield rows


def _typed_fits(value: object, paths: set, depth: int = 0, path: str = "") -> bool:
    """Can a typed Arrow column hold `value` (and a Parquet reader read it back)? Not when it nests
    deeper than MAX_TYPED_DEPTH, holds an int outside int64, or the results together name more than
    MAX_TYPED_FIELDS keys (`paths`, shared across results: keys that differ per record made one
    struct field per record, and each batch cost grew with every key seen before it). Linear in the
    size of the value; stops at the first misfit."""
    if depth > MAX_TYPED_DEPTH:
        return False
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{path}.{k}"
            if p not in paths:
                paths.add(p)
                if len(paths) > MAX_TYPED_FIELDS:
                    return False
            if not _typed_fits(v, paths, depth + 1, p):
                return False
        return True
    if isinstance(value, list):
        return all(_typed_fits(v, paths, depth + 1, path + "[]") for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _INT64_MIN <= value <= _INT64_MAX
    return True


def _infer_result_type(pa, staging: Path):
    """One Arrow type for every result, or None when they do not unify or do not fit a typed
    column."""
    unified, paths = None, set()
    try:
        for rows in _batches(staging):
            results = [r.get("result") for r in rows]
            if not all(_typed_fits(v, paths) for v in results):
                return None
            typ = pa.array(results).type
            schema = pa.schema([("result", typ)])
            unified = schema if unified is None else pa.unify_schemas([unified, schema],
                                                                      promote_options="permissive")
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return None
    return pa.null() if unified is None else unified.field("result").type


def _write(pa, pq, staging: Path, tmp: Path, result_type) -> int:
    as_json = result_type is None
    schema = pa.schema([("index", pa.int64()),
                        ("result_json", pa.string()) if as_json else ("result", result_type),
                        ("error_type", pa.string()), ("error_message", pa.string())])
    total = 0
    # A file object, not the path: pyarrow encodes a path as UTF-8, and a file name that is not
    # UTF-8 fails there.
    with open(tmp, "wb") as sink, pq.ParquetWriter(sink, schema) as writer:
        for rows in _batches(staging):
            results = [r.get("result") for r in rows]
            if as_json:
                results = [
                    None if "error" in r else json.dumps(r["result"], ensure_ascii=False)
                    for r in rows
                ]
            errors = [r.get("error") or {} for r in rows]
            writer.write_table(pa.Table.from_arrays([
                pa.array([r["index"] for r in rows], pa.int64()),
                pa.array(results, schema.field(1).type),
                # valid text even in a staging file an earlier forge wrote with lone surrogates
                # escaped
                pa.array([_text(e.get("type")) for e in errors], pa.string()),
                pa.array([_text(e.get("message")) for e in errors], pa.string()),
            ], schema=schema))
            total += len(rows)
    return total


def _text(value: object) -> object:
    return valid_text(value) if isinstance(value, str) else value


def _read_back(path: Path, rows: int) -> str | None:
    """Read every column of the written file back, as a user's reader would; None when it reads
    whole, else why not (a file pyarrow wrote but cannot open, e.g. a schema too deeply nested)."""
    try:
        import pyarrow.parquet as pq

        with open(path, "rb") as source:
            f = pq.ParquetFile(source)
            seen = sum(batch.num_rows for batch in f.iter_batches(batch_size=_BATCH_ROWS))
    except Exception as e:  # noqa: BLE001 - whatever the reader raises, the file is not fit to be the output
        return " ".join(f"{type(e).__name__}: {e}".split())
    return None if seen == rows else f"it reads back {seen:,} rows, not {rows:,}"


def _convert(pa, pq, staging: Path, tmp: Path) -> int:
    """Typed when every result fits and the file reads back; else (or then) the JSON column, read
    back too."""
    result_type = _infer_result_type(pa, staging)
    if result_type is not None:
        try:
            rows = _write(pa, pq, staging, tmp, result_type)
            if _read_back(tmp, rows) is None:
                return rows
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass  # a type Arrow inferred but cannot write: the JSON column
    rows = _write(pa, pq, staging, tmp, None)
    problem = _read_back(tmp, rows)
    if problem is not None:
        raise ForgeError(f"{display_path(tmp)}: cannot read back the Parquet file just written "
                         f"({problem})")
    return rows


def jsonl_to_parquet(staging: str | os.PathLike, target: str | os.PathLike) -> int:
    """Convert the staging JSONL to `target` atomically (temp file, fsync, read back, rename).
    Returns rows. On any failure the temp file is removed and the staging file left as it is (the
    rows are not lost)."""
    pa, pq = _arrow()
    staging, target = Path(staging), Path(target)
    # A fresh name (O_EXCL): the conversion never writes over a file that happens to sit beside the
    # output.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o644)    # what the output would have had, not mkstemp's owner-only mode
        os.close(fd)
        rows = _convert(pa, pq, staging, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(
            e, (OSError, pa.ArrowException, ForgeError, ValueError, TypeError, OverflowError)
        ):
            raise ForgeError(f"{display_path(target)}: cannot write Parquet: {e}") from None
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)
    return rows


def iter_index_column(path: str | os.PathLike) -> Iterator[tuple[list[int], list[bool]]]:
    """A forge Parquet output's (indices, is_error) in row batches (rebuilding a lost ledger from
    it)."""
    pa, pq = _arrow()
    try:
        with open(path, "rb") as source:
            f = pq.ParquetFile(source)
            for batch in f.iter_batches(batch_size=_BATCH_ROWS, columns=["index", "error_type"]):
                cols = batch.to_pydict()
                yield cols["index"], [e is not None for e in cols["error_type"]]
    except (OSError, pa.ArrowException, KeyError) as e:
        raise ForgeError(f"{display_path(path)}: cannot read its index column: {e}") from None
