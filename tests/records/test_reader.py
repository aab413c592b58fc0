"""Reading records: every input line is exactly one index, bad lines become error rows."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.errors import ForgeError
from forge.records import InputError, open_records


def _write(tmp_path, data: bytes, name="in.jsonl"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_every_line_is_one_index_and_bad_lines_are_errors(tmp_path):
    data = (
        b'{"a": 1}\r\n\n   \n\xff\xfe{}\n{"a":\n[1, 2]\n"s"\nnull\ntrue\nNaN\n{"b": NaN}\n{"z": 26}'
    )
    src = open_records(_write(tmp_path, data))
    items = list(src)
    assert [i for i, _ in items] == list(range(12)) and src.count() == 12
    got = [r if isinstance(r, dict) else r.type for _, r in items]
    assert got == [{"a": 1}, "InputEmptyLine", "InputEmptyLine", "InputNotUTF8", "InputInvalidJSON",
                   "InputNotObject", "InputNotObject", "InputNotObject", "InputNotObject",
                   "InputInvalidJSON", "InputInvalidJSON", {"z": 26}]
    # messages name file and 1-based line
    assert items[5][1].message.endswith("in.jsonl:6: expected a JSON object, got an array")
    assert "not valid UTF-8 at byte 0" in items[3][1].message


def test_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    src = open_records(_write(tmp_path, b'\xef\xbb\xbf{"a": 1}\n'))
    assert list(src) == [(0, {"a": 1})]


def test_oversized_line_is_an_error_row_and_not_held_in_memory(tmp_path):
    big = b'{"x": "' + b"y" * 5000 + b'"}'
    src = open_records(
        _write(tmp_path, b'{"a": 1}\n' + big + b'\n{"b": 2}\n' + big), max_line_bytes=100
    )
    items = list(src)
    assert [i for i, _ in items] == [0, 1, 2, 3] and src.count() == 4
    assert items[1][1].type == "InputTooLarge" and items[3][1].type == "InputTooLarge"
    assert items[2] == (2, {"b": 2})


def test_line_of_exactly_the_limit_is_accepted(tmp_path):
    line = b'{"x": "' + b"y" * 91 + b'"}'   # exactly 100 bytes
    assert len(line) == 100
    for eol in (b"\n", b"\r\n", b""):
        src = open_records(_write(tmp_path, line + eol), max_line_bytes=100)
        assert isinstance(list(src)[0][1], dict)
        src = open_records(_write(tmp_path, line + b" " + eol), max_line_bytes=100)
        assert list(src)[0][1].type == "InputTooLarge"


def test_skip_does_not_decode_settled_lines(tmp_path):
    src = open_records(_write(tmp_path, b'{"a": 0}\nbroken\n{"a": 2}\n'))
    assert list(src.records(skip=lambda i: i == 1)) == [(0, {"a": 0}), (2, {"a": 2})]


def test_empty_file_has_no_records(tmp_path):
    src = open_records(_write(tmp_path, b""))
    assert list(src) == [] and src.count() == 0


def test_missing_or_unreadable_input_is_refused_in_one_line(tmp_path):
    with pytest.raises(ForgeError, match="input file does not exist"):
        open_records(tmp_path / "nope.jsonl")
    with pytest.raises(ForgeError, match="not a regular file"):
        open_records(tmp_path)


def test_fingerprint_follows_content_not_mtime(tmp_path):
    a = _write(tmp_path, b'{"a": 1}\n', "a.jsonl")
    b = tmp_path / "b.jsonl"
    shutil.copy(a, b)
    assert open_records(a).fingerprint() == open_records(b).fingerprint()
    b.write_bytes(b'{"a": 2}\n')
    assert open_records(a).fingerprint() != open_records(b).fingerprint()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.dictionaries(st.text(max_size=5), st.integers()).map(
                lambda d: json.dumps(d).encode()
            ),
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_count_matches_iteration_for_any_bytes(tmp_path_factory, lines, trailing_newline):
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines) + (
        b"\n" if trailing_newline and lines else b""
    )
    path = tmp_path_factory.mktemp("h") / "in.jsonl"
    path.write_bytes(data)
    src = open_records(path, max_line_bytes=32)
    items = list(src)
    assert [i for i, _ in items] == list(range(src.count()))
    assert all(isinstance(r, (dict, InputError)) for _, r in items)


# --- Parquet ---------------------------------------------------------------------------------
def test_parquet_rows_become_records(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": list(range(3000)), "text": [f"t{i}" for i in range(3000)]}),
        path,
        row_group_size=700,
    )
    src = open_records(path)
    assert src.format == "parquet" and src.count() == 3000
    items = list(src.records(skip=lambda i: i < 2048 or i % 2))
    assert items[0] == (2048, {"id": 2048, "text": "t2048"}) and len(items) == 476


def test_a_broken_parquet_file_is_refused_up_front(tmp_path):
    pytest.importorskip("pyarrow")
    with pytest.raises(ForgeError, match="not a readable Parquet file"):
        open_records(_write(tmp_path, b"PAR1 not really", "in.parquet"))


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ForgeError, match=r"needs pyarrow \(pip install 'forge-llm\[parquet\]'\)"):
        open_records(_write(tmp_path, b"x", "in.parquet"))
