"""Parquet output, made from the durable JSONL staging file once a run is complete.

Parquet cannot be appended to safely (its footer is written last), so a run always writes JSONL
as it goes and converts at the end. Columns: `index` (int64), `result` (typed: Arrow infers one
type for all results, e.g. a struct of the function's dict), `error_type`, `error_message`.
Results whose types do not unify (a dict here, a string there) go to a `result_json` column of
JSON text instead. Rows keep completion order; sort by `index` for input order."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from forge.errors import ForgeError, display_path

_BATCH_ROWS = 4096


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


def _infer_result_type(pa, staging: Path):
    """One Arrow type for every result, or None when they do not unify."""
    unified = None
    try:
        for rows in _batches(staging):
            typ = pa.array([r.get("result") for r in rows]).type
            schema = pa.schema([("result", typ)])
            unified = schema if unified is None else pa.unify_schemas([unified, schema],
                                                                      promote_options="permissive")
    except (pa.ArrowException, ValueError, TypeError):
        return None
    return pa.null() if unified is None else unified.field("result").type


def _write(pa, pq, staging: Path, tmp: Path, result_type) -> int:
    as_json = result_type is None
    schema = pa.schema([("index", pa.int64()),
                        ("result_json", pa.string()) if as_json else ("result", result_type),
                        ("error_type", pa.string()), ("error_message", pa.string())])
    total = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for rows in _batches(staging):
            results = [r.get("result") for r in rows]
            if as_json:
                results = [None if "error" in r else json.dumps(r["result"], ensure_ascii=False) for r in rows]
            errors = [r.get("error") or {} for r in rows]
            writer.write_table(pa.Table.from_arrays([
                pa.array([r["index"] for r in rows], pa.int64()),
                pa.array(results, schema.field(1).type),
                pa.array([e.get("type") for e in errors], pa.string()),
                pa.array([e.get("message") for e in errors], pa.string()),
            ], schema=schema))
            total += len(rows)
    return total


def jsonl_to_parquet(staging: str | os.PathLike, target: str | os.PathLike) -> int:
    """Convert the staging JSONL to `target` atomically (temp file, fsync, rename). Returns rows."""
    pa, pq = _arrow()
    staging, target = Path(staging), Path(target)
    # A fresh name (O_EXCL): the conversion never writes over a file that happens to sit beside the output.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)        # what the output would have had, not mkstemp's owner-only mode
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        result_type = _infer_result_type(pa, staging)
        try:
            rows = _write(pa, pq, staging, tmp, result_type)
        except (pa.ArrowException, ValueError, TypeError):
            if result_type is None:
                raise
            rows = _write(pa, pq, staging, tmp, None)  # a type Arrow inferred but cannot write
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except (OSError, pa.ArrowException) as e:
        tmp.unlink(missing_ok=True)
        raise ForgeError(f"{display_path(target)}: cannot write Parquet: {e}") from None
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)
    return rows


def iter_index_column(path: str | os.PathLike) -> Iterator[tuple[list[int], list[bool]]]:
    """A forge Parquet output's (indices, is_error) in row batches (rebuilding a lost ledger from it)."""
    pa, pq = _arrow()
    try:
        f = pq.ParquetFile(path)
        for batch in f.iter_batches(batch_size=_BATCH_ROWS, columns=["index", "error_type"]):
            cols = batch.to_pydict()
            yield cols["index"], [e is not None for e in cols["error_type"]]
    except (OSError, pa.ArrowException, KeyError) as e:
        raise ForgeError(f"{display_path(path)}: cannot read its index column: {e}") from None
