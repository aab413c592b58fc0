"""Output rows: encoding, the locked writer, reconciliation after a crash, Parquet conversion."""
from __future__ import annotations

import json
import sys

import pytest

from forge.errors import ForgeError
from forge.records import OutputWriter, encode_error, encode_result
from forge.records.parquet_out import jsonl_to_parquet


def test_rows_have_the_documented_shape():
    line, err = encode_result(3, {"a": "é"})
    assert (json.loads(line), err) == ({"index": 3, "result": {"a": "é"}}, False)
    assert json.loads(encode_error(4, "ValueError", "bad\nthing")) == {
        "index": 4, "error": {"type": "ValueError", "message": "bad\nthing"}}


@pytest.mark.parametrize(
    "value", [{1, 2}, object(), float("nan"), {"x": float("inf")}, "\ud800", b"bytes"]
)
def test_results_that_are_not_strict_json_become_serialization_errors(value):
    line, err = encode_result(0, value)
    row = json.loads(line)
    assert err and row["error"]["type"] == "SerializationError" and row["index"] == 0


def test_cyclic_result_is_a_serialization_error():
    a: list = []
    a.append(a)
    assert json.loads(encode_result(0, a)[0])["error"]["type"] == "SerializationError"


def test_huge_error_messages_are_cut():
    row = json.loads(encode_error(0, "E", "x" * 100_000))
    assert len(row["error"]["message"]) < 9000 and row["error"]["message"].endswith("(truncated)")


def test_two_writers_on_one_output_are_refused(tmp_path):
    w = OutputWriter(tmp_path / "out.jsonl")
    with pytest.raises(ForgeError, match="another forge run is writing this output"):
        OutputWriter(tmp_path / "out.jsonl")
    w.close()
    OutputWriter(tmp_path / "out.jsonl").close()


def _rows(*idx, error=()):
    return [encode_error(i, "E", "m") if i in error else encode_result(i, {"v": i})[0] for i in idx]


def test_reconcile_reads_indices_and_cuts_a_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    w = OutputWriter(path)
    w.append(_rows(0, 2, 5, error={2}))
    full = path.stat().st_size
    w.append(_rows(7))
    w.truncate(full + 9)                 # the kill came in the middle of writing row 7
    rec = w.reconcile()
    assert sorted(rec.present) == [0, 2, 5] and sorted(rec.errors) == [2]
    assert rec.truncated_bytes == 9 and path.stat().st_size == full and rec.rows == 3
    w.close()


def test_reconcile_cuts_trailing_garbage_but_refuses_garbage_in_the_middle(tmp_path):
    path = tmp_path / "out.jsonl"
    w = OutputWriter(path)
    w.append(_rows(0, 1))
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x00" * 50 + b"\n" + b"\x00" * 20)   # zero-filled tail after a power loss
    rec = w.reconcile()
    assert rec.truncated_bytes == 71 and path.stat().st_size == good
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    w.append(_rows(3))
    with pytest.raises(ForgeError, match=r"out.jsonl: byte \d+: not a forge output row"):
        w.reconcile()
    w.close()


def test_reconcile_reports_duplicates_and_reads_foreign_key_order(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(
        '{"result": 1, "index": 4}\n{"index": 4, "result": 2}\n{"index":9,"error":{}}\n'
    )
    w = OutputWriter(path)
    rec = w.reconcile()
    assert sorted(rec.present) == [4, 9] and rec.duplicates == 1 and rec.first_duplicates == [4]
    assert sorted(rec.errors) == [9]
    w.close()


def test_parquet_output_keeps_typed_result_columns(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    staging = tmp_path / "s.jsonl"
    rows = [encode_result(i, {"id": i, "text": f"t{i}", "score": i / 2})[0] for i in range(5000)]
    rows[3] = encode_error(3, "ValueError", "nope")
    staging.write_text("\n".join(rows) + "\n")
    assert jsonl_to_parquet(staging, tmp_path / "out.parquet") == 5000
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["index", "result", "error_type", "error_message"]
    got = table.to_pylist()
    assert got[4] == {"index": 4, "result": {"id": 4, "text": "t4", "score": 2.0},
                      "error_type": None, "error_message": None}
    assert got[3] == {
        "index": 3,
        "result": None,
        "error_type": "ValueError",
        "error_message": "nope",
    }


def test_parquet_output_falls_back_to_json_text_when_results_do_not_unify(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    staging = tmp_path / "s.jsonl"
    staging.write_text("\n".join([encode_result(0, {"a": 1})[0], encode_result(1, "plain")[0],
                                  encode_result(2, {})[0]]) + "\n")
    jsonl_to_parquet(staging, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("result_json").to_pylist() == ['{"a": 1}', '"plain"', "{}"]
    assert not (tmp_path / "out.parquet.tmp").exists()


def test_parquet_output_without_pyarrow_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ForgeError, match="writing Parquet needs pyarrow"):
        jsonl_to_parquet(tmp_path / "s.jsonl", tmp_path / "out.parquet")


def _strict_json(line: str) -> dict:
    """Parse as a strict reader would: a lone surrogate (escaped or not) is not text."""
    row = json.loads(line)
    # raises UnicodeEncodeError on a lone surrogate
    json.dumps(row, ensure_ascii=False).encode("utf-8")
    return row


@pytest.mark.parametrize(
    "message", ["in/a\udcff.jsonl:3: not valid JSON", "lone \ud800 high", "ok é ✓"]
)
def test_error_rows_are_valid_text_whatever_the_message_holds(message):
    """A file name that is not UTF-8 (surrogateescape) or an exception message holding a lone
    surrogate: the row is strict JSON, the undecodable part written as an escape in the text; valid
    text is kept as it is."""
    row = _strict_json(encode_error(1, "ValueError\udcfe", message))["error"]
    if message.isascii() or "✓" in message:
        assert row["message"] == message
    else:
        assert "\\ud" in row["message"] and row["message"].replace("\\udcff", "").replace(
            "\\ud800", ""
        ) == message.replace("\udcff", "").replace("\ud800", "")
    assert row["type"] == "ValueError\\udcfe"


def test_the_writer_notices_its_output_deleted_replaced_or_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    w = OutputWriter(path)
    w.append(_rows(0, 1))
    assert w.lost() is None
    path.unlink()                                   # rm out.jsonl while the run writes it
    assert "was deleted" in w.lost()
    w.close()
    w = OutputWriter(path)
    w.append(_rows(0, 1))
    with open(path, "r+b") as f:                    # : > out.jsonl
        f.truncate(0)
    assert "was cut short during the run (0 bytes where forge had written" in w.lost()
    w.close()
    w = OutputWriter(path)
    (tmp_path / "other.jsonl").write_text("")
    (tmp_path / "other.jsonl").replace(path)        # another file moved in under the output's name
    assert "replaced by another file" in w.lost()
    w.close()


def test_a_file_that_grows_or_is_written_by_forge_alone_is_still_the_output(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(_rows(0)[0] + "\n")
    w = OutputWriter(path)  # an earlier start's rows: where forge's bytes end now
    w.append(_rows(1))
    w.truncate(path.stat().st_size)
    assert w.lost() is None
    with open(path, "a") as f:
        f.write("more\n")  # longer is not lost (a resume refuses foreign lines)
    assert w.lost() is None
    w.close()
