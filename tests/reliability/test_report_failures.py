"""A report that cannot be written never fails a job whose output is complete (issue 13, item 8): a
file name that is not UTF-8, a name too long for the report's, a folder where no file can be
created, a report path holding a file forge did not write. Each run exits 0 with one warning line,
through the real CLI; its rerun exits 0 too, answering that the output is complete without touching
the report."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    forge,
    run_argv,
    write_echo_input,
)

N = 10          # below echo's first failing record (id 13): a clean run exits 0


def _run(inp, out, *extra, cwd=None):
    return forge(
        *run_argv(ECHO, inp, out)[3:],
        "--report",
        *extra,
        timeout=120,
        **({"cwd": cwd} if cwd else {}),
    )


def _ok_with_warning(r, expect: str) -> None:
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert_no_traceback(r.stderr)
    warnings = [
        x for x in r.stderr.splitlines() if x.startswith("forge: warning: no report written")
    ]
    assert len(warnings) == 1 and expect in warnings[0], r.stderr


def _ok_already_complete(r) -> None:
    """The rerun of a complete job: exit 0, one line (no report to write, so no report failure to
    meet)."""
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert_no_traceback(r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is already complete: all {N} records are in it" in lines[0], (
        r.stderr
    )


def test_an_output_name_that_is_not_utf8(tmp_path):
    """Issue 48: it said "no report written" while the JSON report was written. Both reports are
    written now (the name quoted with its byte escaped in the Markdown) and the run says so."""
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out-\xff.jsonl")
    r = _run(inp, out)
    assert r.returncode == 0 and "warning" not in r.stderr and "forge: report " in r.stderr, (
        r.stderr
    )
    md = (tmp_path / os.fsdecode(b"out-\xff.jsonl.report.md")).read_bytes().decode("utf-8")
    assert "out-\\udcff.jsonl.report.json" in md
    assert (
        (tmp_path / os.fsdecode(b"out-\xff.jsonl.report.json"))
        .read_bytes()
        .startswith(b'{\n "format"')
    )
    _ok_already_complete(_run(inp, out))  # the rerun of the complete job (exit 1 before)
    assert_complete(
        tmp_path / os.fsdecode(b"out-\xff.jsonl"),
        tmp_path / os.fsdecode(b"out-\xff.jsonl.ledger.sqlite"),
        N,
    )


def test_an_output_name_too_long_for_the_report(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / ("o" * 236 + ".jsonl")  # 242 bytes: the report's .report.json.tmp would be 258
    ledger = tmp_path / "run.sqlite"
    _ok_with_warning(_run(inp, out, "--ledger", ledger), "File name too long")
    _ok_already_complete(_run(inp, out, "--ledger", ledger))
    assert_complete(out, ledger, N)


def test_a_report_path_holding_a_file_forge_did_not_write(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    mine = tmp_path / "out.jsonl.report.md"
    mine.write_text("my notes about this run\n")
    _ok_with_warning(_run(inp, out), "out.jsonl.report.md exists and is not a forge report")
    assert mine.read_text() == "my notes about this run\n"
    assert not (tmp_path / "out.jsonl.report.json").exists()
    _ok_already_complete(_run(inp, out))
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    out2 = tmp_path / "out2.jsonl"  # a folder where the report goes, for a run that works
    (tmp_path / "out2.jsonl.report.json").mkdir()
    _ok_with_warning(_run(inp, out2), "is not a regular file")
    assert_complete(out2, tmp_path / "out2.jsonl.ledger.sqlite", N)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="needs root and "
                                                                                "chattr")
def test_a_folder_where_no_file_can_be_created(tmp_path):
    """chattr +i: the folder takes no new entry (like a read-only folder for its owner) while its
    files stay writable, which is how a user meets it: the output was made before the folder became
    read-only."""
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    folder = tmp_path / "ro"
    folder.mkdir()
    out, ledger = folder / "out.jsonl", tmp_path / "run.sqlite"
    out.touch()  # made (empty) before the folder became read-only
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    try:
        _ok_with_warning(_run(inp, out, "--ledger", ledger), "Operation not permitted")
        _ok_already_complete(_run(inp, out, "--ledger", ledger))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert_complete(out, ledger, N)
    assert sorted(p.name for p in folder.iterdir()) == ["out.jsonl"]  # no temp file left behind
