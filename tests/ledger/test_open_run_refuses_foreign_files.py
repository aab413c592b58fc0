"""forge never writes over a file it did not write (issue 13, item 1): the input (by path, symlink
or hard link), a file that is not forge output, forge rows no ledger records, another output's
ledger, a database that is not a ledger, an existing Parquet file. Each case is refused with one
line before anything is changed: the file's bytes are compared before and after."""
from __future__ import annotations

import json
import os
import sqlite3

import pytest

from forge.errors import ForgeError
from forge.ledger import default_ledger_path, make_run_key, open_run, staging_path
from forge.records import encode_result, open_records
from tests.ledger.runs import put_all

N = 6


@pytest.fixture
def job(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(N)))
    (tmp_path / "fn.py").write_text("def f(r): return r\n")
    key = make_run_key(
        function_file=tmp_path / "fn.py", function_name="f", source=open_records(inp)
    )
    return tmp_path, inp, key


def _complete(output, key, inp, **kw):
    run = open_run(output, run_key=key, total=N, input_path=inp, **kw)
    put_all(run, [(i, {"v": i}) for i in range(N) if not run.is_settled(i)])
    return run.close()


def _refused(pattern, path, *, key, inp, output, **kw):
    """open_run must raise with `pattern` and leave `path` byte for byte as it was (and make no
    ledger)."""
    before = path.read_bytes()
    ledger = kw.get("ledger_path") or default_ledger_path(output)
    ledger_before = ledger.exists()
    with pytest.raises(ForgeError, match=pattern) as err:
        open_run(output, run_key=key, total=N, input_path=inp, **kw)
    assert "\n" not in str(err.value)
    assert path.read_bytes() == before
    if not ledger_before:
        assert not ledger.exists(), "a refused run left a ledger behind"
    return str(err.value)


@pytest.mark.parametrize("restart", [False, True])
def test_the_input_as_output_is_refused_even_with_restart(job, restart):
    tmp, inp, key = job
    _refused(
        r"in.jsonl: --output is the same file as --input",
        inp,
        key=key,
        inp=inp,
        output=inp,
        restart=restart,
    )


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_to_the_input_as_output_is_refused(job, link):
    tmp, inp, key = job
    out = tmp / "link.jsonl"
    (os.symlink if link == "symlink" else os.link)(inp, out)
    msg = _refused(
        r"link.jsonl: --output is the same file as --input .*in.jsonl \(through a link\)",
        inp,
        key=key,
        inp=inp,
        output=out,
        restart=True,
    )
    assert "choose another --output" in msg


def test_the_input_as_ledger_is_refused(job):
    tmp, inp, key = job
    _refused(
        r"the ledger is the same file as --input",
        inp,
        key=key,
        inp=inp,
        output=tmp / "out.jsonl",
        ledger_path=inp,
    )


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize(
    "content",
    [
        b"my notes\nline two\n",
        b'{"id": 1}\n',
        b"no newline at the end",
        b'{"index": 0, "result": 1}\nnot ours\n{"index": 1, "result": 2}\n',
        b'{"index": 3, "seen": true}\n',
    ],
)
def test_a_file_that_is_not_forge_output_is_refused_even_with_restart(job, restart, content):
    tmp, inp, key = job
    out = tmp / "notes.txt"
    out.write_bytes(content)
    _refused(
        r"notes.txt: exists and is not forge output .*not even with --restart",
        out,
        key=key,
        inp=inp,
        output=out,
        restart=restart,
    )


def test_a_symlink_output_to_an_unrelated_file_is_refused(job):
    tmp, inp, key = job
    target = tmp / "elsewhere.csv"
    target.write_text("a,b\n1,2\n")
    out = tmp / "out.jsonl"
    out.symlink_to(target)
    _refused(r"exists and is not forge output", target, key=key, inp=inp, output=out)


def test_a_fifo_is_refused_without_blocking(job):
    tmp, inp, key = job
    fifo = tmp / "out.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ForgeError, match="not a regular file"):
        open_run(fifo, run_key=key, total=N, input_path=inp)


def test_forge_rows_no_ledger_records_are_refused_without_restart(job):
    tmp, inp, key = job
    out = tmp / "other-run.jsonl"
    out.write_text(encode_result(0, "theirs")[0] + "\n" + encode_result(1, "theirs")[0] + "\n")
    _refused(
        r"already holds 2 rows but its ledger .* is new; .*--restart",
        out,
        key=key,
        inp=inp,
        output=out,
    )
    _complete(out, key, inp, restart=True)  # forge's own rows: --restart replaces them
    assert [json.loads(x)["result"] for x in out.read_text().splitlines()] == [
        {"v": i} for i in range(N)
    ]


def test_a_torn_row_without_a_ledger_is_refused_but_cut_on_resume(job):
    tmp, inp, key = job
    out = tmp / "out.jsonl"
    run = open_run(out, run_key=key, total=N, input_path=inp)
    put_all(run, [(0, {"v": 0})])
    run.close()
    with open(out, "ab") as f:
        f.write(b'{"index": 1, "res')  # a kill in the middle of a write
    report = _complete(out, key, inp)  # this run's ledger explains it: cut and resumed
    assert report.complete and report.truncated_bytes == len(b'{"index": 1, "res')
    default_ledger_path(out).unlink()
    with open(out, "ab") as f:
        f.write(b'{"index": 9, "res')
    # no ledger: not even the torn row is cut
    _refused(r"is new", out, key=key, inp=inp, output=out)


def test_garbage_after_this_runs_rows_is_never_cut(job):
    tmp, inp, key = job
    out = tmp / "out.jsonl"
    run = open_run(out, run_key=key, total=N, input_path=inp)
    put_all(run, [(0, {"v": 0})])
    run.close()
    with open(out, "ab") as f:
        f.write(b"a line someone appended\n")
    _refused(r"exists and is not forge output \(byte \d+ ", out, key=key, inp=inp, output=out)


def test_another_outputs_ledger_is_refused(job):
    tmp, inp, key = job
    _complete(tmp / "a.jsonl", key, inp)
    b = tmp / "b.jsonl"
    b.write_text(encode_result(0, "b's")[0] + "\n")
    _refused(
        r"a.jsonl.ledger.sqlite: this ledger records the run writing a.jsonl, not b.jsonl",
        b,
        key=key,
        inp=inp,
        output=b,
        ledger_path=default_ledger_path(tmp / "a.jsonl"),
    )


@pytest.mark.parametrize("restart", [False, True])
def test_an_sqlite_database_that_is_not_a_ledger_is_left_alone(job, restart):
    tmp, inp, key = job
    db_path = tmp / "app.db"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("INSERT INTO users VALUES ('ada')")
    db.commit()
    db.close()
    _refused(
        r"app.db: not a forge ledger \(an SQLite database with tables users\)",
        db_path,
        key=key,
        inp=inp,
        output=tmp / "out.jsonl",
        ledger_path=db_path,
        restart=restart,
    )


@pytest.mark.parametrize("restart", [False, True])
def test_an_existing_parquet_file_that_is_not_forge_output_is_never_replaced(job, restart):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, inp, key = job
    out = tmp / "data.parquet"
    pq.write_table(pa.table({"customer": ["ada", "bob"]}), out)
    _refused(r"data.parquet: exists and is not forge output \(not a Parquet file with forge's "
             r"columns\)", out,
             key=key, inp=inp, output=out, restart=restart)
    out.write_text("not parquet at all")
    _refused(r"exists and is not forge output", out, key=key, inp=inp, output=out, restart=restart)


def test_forge_parquet_output_no_ledger_explains_is_replaced_only_with_restart(job):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, inp, key = job
    out = tmp / "out.parquet"
    pq.write_table(pa.table({"index": pa.array([0, 1], pa.int64()), "result": ["a", "b"],
                             "error_type": pa.array([None, None], pa.string()),
                             # 2 of 6 rows
                             "error_message": pa.array([None, None], pa.string())}), out)
    _refused(
        r"out.parquet: exists but its ledger .* is new; .*--restart",
        out,
        key=key,
        inp=inp,
        output=out,
    )
    assert _complete(out, key, inp, restart=True).complete
    assert sorted(pq.read_table(out).column("index").to_pylist()) == list(range(N))
    assert not staging_path(out).exists()
    assert not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]


def test_a_parquet_input_is_not_its_own_output(job):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, _, key = job
    inp = tmp / "in.parquet"
    pq.write_table(pa.table({"id": list(range(N))}), inp)
    _refused(
        r"--output is the same file as --input", inp, key=key, inp=inp, output=inp, restart=True
    )


def test_an_empty_existing_output_is_used(job):
    tmp, inp, key = job
    out = tmp / "out.jsonl"
    out.touch()  # e.g. made by mktemp: nothing in it to lose
    assert _complete(out, key, inp).complete
