"""The OpenAI batch output, in input order, made from the job's rows once every line has one.

The job writes its rows as any forge job does (the ledger-backed JSONL beside the output, in
completion order, each row once: resumable, exactly once). Once the job is complete, this file is
made from those rows in input order, one row per input line, into a temp file renamed over the
output (forge/atomic.py): a reader sees no output, or the whole of it. A forge error row (the line's
request failed outside the request itself: an engine error) becomes the OpenAI row vLLM writes for a
failed request: status 500, body null, `error` the OpenAI error object naming what failed."""
from __future__ import annotations

import json
import re
from array import array
from pathlib import Path

from forge.atomic import replace_file
from forge.errors import ForgeError, display_path
from forge.openai_batch.answer import error_row
from forge.records.shards import open_input

_ROW_HEAD = re.compile(rb'\{"index": (0|[1-9]\d{0,18}), "(result|error)": ')


def rows_path(output: Path) -> Path:
    """Where the job's own rows go: beside the output."""
    return output.with_name(output.name + ".rows.jsonl")


def _offsets(rows: Path, total: int) -> array:
    """Byte offset of each index's row in the job's rows (-1: none)."""
    where = array("q", [-1]) * total
    at = 0
    with open(rows, "rb") as f:
        for line in f:
            m = _ROW_HEAD.match(line)
            if m is not None and int(m.group(1)) < total:
                where[int(m.group(1))] = at
            at += len(line)
    return where


def write_in_input_order(batch_file: Path, rows: Path, output: Path) -> tuple[int, int]:
    """Write `output` from `rows` in `batch_file`'s order; (rows written, of them error rows). A
    line without a row is refused (the job is not complete: nothing is written)."""
    source = open_input(batch_file)
    total = source.count()
    where = _offsets(rows, total)
    missing = [i for i in range(total) if where[i] < 0]
    if missing:
        raise ForgeError(f"{display_path(rows)}: {len(missing):,} of {total:,} batch lines have no "
                         "row yet (first: "
                         f"line {missing[0] + 1}); run the same command again to finish them")
    errors = 0

    def write(out) -> None:
        nonlocal errors
        with open(rows, "rb") as f:
            for index, record in source.records():
                f.seek(where[index])
                row = json.loads(f.readline())
                custom_id = str(record.get("custom_id")) if isinstance(record, dict) else ""
                if "result" in row:
                    answer = row["result"]
                # the line failed outside its request: the shape vLLM writes for a failed request
                else:
                    failed = row["error"]
                    answer = error_row(custom_id, 500, f"{failed['type']}: {failed['message']}",
                                       row_id=f"forge-error-{index}")
                errors += answer.get("error") is not None
                out.write(json.dumps(answer, ensure_ascii=False).encode("utf-8") + b"\n")

    replace_file(output, write, fsync=True)
    return total, errors
