"""A Parquet input with a damaged data page, its footer intact (issue 29, row 6): the records of the
row group that cannot be decoded are error rows naming the file and the row group, the other records
run, and a rerun finds the output complete. It was `internal error: OSError` (three lines), 0 rows,
on every rerun. Real `forge run` on the instant node."""
from __future__ import annotations

import shutil

import pytest

from forge import constants
from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    record_figures,
    run_argv,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GROUPS, PER_GROUP = 3, 40


def _damaged(tmp_path, where: str):
    path = tmp_path / "good.parquet"
    n = GROUPS * PER_GROUP
    pq.write_table(
        pa.table({"id": [100 + i for i in range(n)], "text": [f"record {i}" for i in range(n)]}),
        path,
        row_group_size=PER_GROUP,
        compression="snappy",
    )
    col = pq.ParquetFile(path).metadata.row_group(1).column(1)
    offset = {"page-header": col.data_page_offset, "dictionary": col.dictionary_page_offset + 30}[
        where
    ]
    bad = tmp_path / "in.parquet"
    shutil.copy(path, bad)
    with open(bad, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 16)
    return bad, n


@pytest.mark.parametrize("where", ["page-header", "dictionary"])
def test_a_damaged_page_fails_its_records_and_the_rerun_finishes(tmp_path, where):
    inp, n = _damaged(tmp_path, where)
    out = tmp_path / "out.jsonl"
    r = forge(*run_argv(ECHO, inp, out)[3:], timeout=120)
    assert_no_traceback(r.stderr)
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    rows = {row["index"]: row for row in read_rows(out)}
    failed = sorted(
        i for i, row in rows.items() if row.get("error", {}).get("type") == "InputUnreadable"
    )
    assert failed == list(range(PER_GROUP, 2 * PER_GROUP)), failed
    assert all(
        "result" in rows[i] or rows[i]["error"]["type"] == "ValueError"
        for i in set(rows) - set(failed)
    )
    err = rows[PER_GROUP]["error"]
    assert (
        err["type"] == "InputUnreadable"
        and "row group 1" in err["message"]
        and "\n" not in err["message"]
    )
    assert "in.parquet" in err["message"]
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", n)
    r = forge(*run_argv(ECHO, inp, out)[3:], timeout=120)
    assert r.returncode == 3 and "already complete" in r.stderr, r.stderr
    record_figures(
        f"parquet-input-damaged-{where}",
        records=n,
        unreadable_rows=len(failed),
        message=err["message"],
    )
