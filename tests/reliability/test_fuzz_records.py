"""Bad input records: malformed JSON, huge lines, wrong encodings, NUL bytes, deep nesting, NaN,
BOMs, CR/LF mixes, a missing last newline. Every input line becomes exactly one index: a record, or
an error row that names the file and line; the reader never raises, never holds an oversized line,
never loses count."""
from __future__ import annotations

import json
import os
import subprocess
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from forge.errors import ForgeError
from forge.records.shards import open_input
from forge.records import InputError, open_records
from forge.constants import EXIT_ERROR_ROWS
from tests.reliability._rel import (
    ECHO,
    NODES,
    RssSampler,
    assert_complete,
    assert_no_traceback,
    env,
    forge,
    read_rows,
    record_figures,
    run_argv,
)

FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)
MAX_LINE = 2000  # the reader's limit in the property test (the CLI test uses the real 16 MiB)
ERROR_TYPES = {
    "InputTooLarge",
    "InputNotUTF8",
    "InputEmptyLine",
    "InputInvalidJSON",
    "InputNotObject",
}

objects = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=20),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    max_size=5,
)
lines = st.one_of(
    objects.map(lambda o: ("record", json.dumps(o, ensure_ascii=False).encode("utf-8"))),
    st.text(st.characters(exclude_characters="\n"), max_size=60).map(
        lambda t: ("junk", t.encode("utf-8", "surrogatepass"))
    ),
    st.sampled_from(
        [
            b"[1, 2]",
            b"42",
            b'"text"',
            b"null",
            b"true",
            b"NaN",
            b'{"a": NaN}',
            b'{"a": Infinity}',
            b'{"a": 1e999}',
            b'{"a": 1,}',
            b"{'a': 1}",
            b'{"a": 1}{"b": 2}',
            b"\x00",
            b'{"a": "\x00"}',
            b"   ",
            b"",
            b"\t",
            b'{"a":1}\r',
            b'{"a": "\xff"}',
            b"\xef\xbb\xbf{}",
            b'{"\\ud800": 1}',
            b"[" * 5000 + b"]" * 5000,
            b'{"a":' * 3000 + b"1" + b"}" * 3000,
        ]
    ).map(lambda b: ("fixed", b)),
    st.binary(max_size=40).filter(lambda b: b"\n" not in b).map(lambda b: ("bytes", b)),
    objects.map(
        lambda o: ("latin1", json.dumps(o, ensure_ascii=False).encode("latin-1", "replace"))
    ),
    objects.map(lambda o: ("utf16", json.dumps(o).encode("utf-16").replace(b"\n", b""))),
    st.integers(MAX_LINE - 2, MAX_LINE * 3).map(lambda n: ("long", b'{"t": "' + b"x" * n + b'"}')),
)


def _check_file(path, raw_lines: list[bytes], last_newline: bool, skip: set[int]) -> int:
    src = open_records(path, max_line_bytes=MAX_LINE)
    n = len(raw_lines)
    assert src.count() == n
    seen = []
    for index, item in src.records(skip=(lambda i: i in skip) if skip else None):
        seen.append(index)
        if isinstance(item, InputError):
            assert item.type in ERROR_TYPES
            assert item.message.startswith(f"{path}:{index + 1}: ") and "\n" not in item.message, (
                item.message
            )
            if item.type == "InputTooLarge":
                assert len(raw_lines[index].rstrip(b"\r")) > MAX_LINE
        else:
            assert isinstance(item, dict)
            assert json.loads(raw_lines[index].lstrip(b"\xef\xbb\xbf").rstrip(b"\r") if index == 0
                              else raw_lines[index].rstrip(b"\r")) == item
    assert seen == [i for i in range(n) if i not in skip]
    return len(seen)


STATS = {"files": 0, "lines": 0, "errors": 0}


@pytest.mark.timeout(300)
@settings(max_examples=300, derandomize=True, **FUZZ)
@given(
    chosen=st.lists(lines, min_size=1, max_size=30),
    last_newline=st.booleans(),
    bom=st.booleans(),
    crlf=st.booleans(),
    data=st.data(),
)
def test_every_input_line_becomes_exactly_one_record_or_error(
    tmp_path_factory, chosen, last_newline, bom, crlf, data
):
    raw_lines = [b for _, b in chosen]
    if bom:
        raw_lines[0] = b"\xef\xbb\xbf" + raw_lines[0]
    end = b"\r\n" if crlf else b"\n"
    body = end.join(raw_lines) + (end if last_newline else b"")
    if not last_newline and raw_lines[-1] == b"":
        raw_lines = raw_lines[:-1] or [b""]            # an empty last piece is not a line
        if not body:
            return
    path = tmp_path_factory.getbasetemp() / "records.jsonl"
    path.write_bytes(body)
    skip = set(data.draw(st.lists(st.integers(0, len(raw_lines) - 1), max_size=5), label="skip"))
    tracemalloc.start()
    try:
        _check_file(path, raw_lines, last_newline, skip)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * MAX_LINE + 4 * len(body) + (1 << 20)
    STATS["files"] += 1
    STATS["lines"] += len(raw_lines)


def test_hostile_input_file_through_forge_run(tmp_path):
    """One file with every kind of bad line, the real 16 MiB line limit and a 17 MiB line, through
    the CLI: one row per line, error rows typed, no traceback, and the process's peak RSS stays
    bounded."""
    big = 17 * 2**20
    specimens = [
        (b'{"id": 0, "text": "fine"}', None),
        (b"{not json", "InputInvalidJSON"),
        (b"", "InputEmptyLine"),
        (b"[1, 2, 3]", "InputNotObject"),
        (b'{"id": 4, "text": "caf\xe9"}', "InputNotUTF8"),  # latin-1
        ('{"id": 5, "text": "x"}'.encode("utf-16"), "InputNotUTF8"),  # UTF-16 with its BOM
        (b'{"id": 6, "text": "nul\x00"}', "InputInvalidJSON"),
        (b'{"id": 7, "v": NaN}', "InputInvalidJSON"),
        (b"[" * 200_000 + b"]" * 200_000, "InputInvalidJSON"),  # nesting: RecursionError
        (b'{"id": 9, "text": "' + b"y" * big + b'"}', "InputTooLarge"),
        (b'{"id": 10, "text": "crlf"}\r', None),
        (b'{"id": 11, "text": "' + "\u2028 \U0001f600 \u202e".encode("utf-8") + b'"}', None),
        # CESU-8
        (
            b'{"id": 12, "text": "' + "\ud83d".encode("utf-8", "surrogatepass") + b'"}',
            "InputNotUTF8",
        ),
        (b'{"id": 14, "text": "no newline at the end"}', None),
    ]
    inp = tmp_path / "hostile.jsonl"
    inp.write_bytes(b"\xef\xbb\xbf" + b"\n".join(b for b, _ in specimens))
    out = tmp_path / "out.jsonl"
    with open(tmp_path / "run.err", "w") as err:
        proc = subprocess.Popen(
            run_argv(ECHO, inp, out, NODES / "instant.yaml"),
            env=env(),
            stderr=err,
            stdout=subprocess.DEVNULL,
        )
    sampler = RssSampler(proc.pid, 0.02)
    sampler.start()
    t0 = time.monotonic()
    rc = proc.wait(timeout=120)
    took = time.monotonic() - t0
    sampler.stop()
    text = (tmp_path / "run.err").read_text()
    assert rc == EXIT_ERROR_ROWS, text                # complete; the hostile lines are error rows
    assert_no_traceback(text)
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), len(specimens))
    rows = {r["index"]: r for r in read_rows(out)}
    for i, (_, want) in enumerate(specimens):
        if want is None:
            assert "result" in rows[i], rows[i]
        else:
            assert rows[i]["error"]["type"] == want, (i, rows[i])
            assert rows[i]["error"]["message"].startswith(f"{inp}:{i + 1}: ")
    peak_mib = sampler.peak_kib / 1024
    assert peak_mib < 400, peak_mib
    record_figures(
        "fuzz-records",
        property_files=STATS["files"],
        property_lines=STATS["lines"],
        hostile_lines=len(specimens),
        largest_line_mib=17,
        cli_peak_rss_mib=round(peak_mib, 1),
        cli_wall_s=round(took, 1),
    )


@pytest.mark.parametrize("kind", ["missing", "folder", "device", "bad-parquet"])
def test_unreadable_inputs_are_refused_with_one_line(tmp_path, kind):
    # A folder is read as shards (forge/records/shards.py): one without any is refused. A FIFO is a
    # pipe now (test_a_fifo_without_a_writer_never_blocks below).
    path = {"missing": tmp_path / "nope.jsonl", "folder": tmp_path, "device": "/dev/zero",
            "bad-parquet": tmp_path / "bad.parquet"}[kind]
    if kind == "bad-parquet":
        path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ForgeError):
        open_input(path)
    r = forge(
        "run",
        ECHO,
        "--node",
        NODES / "instant.yaml",
        "--input",
        path,
        "--output",
        tmp_path / "out.jsonl",
        timeout=60,
    )
    assert r.returncode in (1, 2), r.stderr  # 2: click refuses a folder as a usage error
    assert_no_traceback(r.stderr)
    lines = r.stderr.strip().splitlines()
    assert (len(lines) == 1 or r.returncode == 2) and any(str(path) in line for line in lines), (
        r.stderr
    )


def test_a_fifo_without_a_writer_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    r = forge(
        "run",
        ECHO,
        "--node",
        NODES / "instant.yaml",
        "--input",
        fifo,
        "--output",
        tmp_path / "out.jsonl",
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert_no_traceback(r.stderr)
    assert r.stderr.strip().splitlines()[-1] == (f"forge: {fifo}: no process writes to this pipe "
                                                 "(none opened it "
                                                 "within 10 s): start its writer first, or give a "
                                                 "file")
