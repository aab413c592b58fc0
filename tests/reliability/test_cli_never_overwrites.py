"""`forge run` never writes over a file it did not write (issue 13, item 1), through the real CLI:
the input as its own output (by name, symlink, hard link), an unrelated file, a symlink's target,
another run's output, an unrelated Parquet file. Each is refused with exit 1 and one line; the file
is byte for byte what it was."""
from __future__ import annotations

import os

import pytest

from tests.reliability._rel import ECHO, assert_no_traceback, forge, run_argv, write_echo_input

N = 40


def _run(inp, out, *extra):
    # argv without "python -m forge"
    return forge(*run_argv(ECHO, inp, out)[3:], *extra, timeout=120)


def _refused(inp, out, protected, *extra, pattern: str):
    before = protected.read_bytes()
    r = _run(inp, out, *extra)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert_no_traceback(r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("forge: ") and pattern in lines[0], r.stderr
    assert protected.read_bytes() == before, "the file was changed"


@pytest.mark.parametrize("restart", [[], ["--restart"]])
def test_the_input_is_never_its_own_output(tmp_path, restart):
    inp = write_echo_input(tmp_path / "io.jsonl", N)
    _refused(inp, inp, inp, *restart, pattern="--output is the same file as --input")
    sym = tmp_path / "sym.jsonl"
    sym.symlink_to(inp)
    _refused(inp, sym, inp, *restart, pattern="(through a link)")
    hard = tmp_path / "hard.jsonl"
    os.link(inp, hard)
    _refused(inp, hard, inp, *restart, pattern="(through a link)")
    _refused(inp, tmp_path / "out.jsonl", inp, "--ledger", sym, *restart,
             pattern="the ledger is the same file as --input")


@pytest.mark.parametrize("restart", [[], ["--restart"]])
def test_an_unrelated_file_or_a_symlinks_target_is_never_overwritten(tmp_path, restart):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n\nnot forge output\n")
    _refused(inp, notes, notes, *restart, pattern="exists and is not forge output")
    link = tmp_path / "out.jsonl"
    link.symlink_to(notes)
    _refused(inp, link, notes, *restart, pattern="exists and is not forge output")


def test_another_runs_output_is_replaced_only_with_restart(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    # stops at record 13
    r = _run(inp, out, "--ledger", tmp_path / "first.sqlite", "--max-errors", "0")
    assert r.returncode == 4, r.stderr
    # its own ledger is elsewhere: not this run's
    _refused(inp, out, out, pattern="rows but its ledger")
    r = _run(inp, out, "--restart")
    assert r.returncode == 3, r.stderr  # complete; echo fails record 13 on purpose


@pytest.mark.parametrize("restart", [[], ["--restart"]])
def test_an_existing_parquet_file_is_never_silently_replaced(tmp_path, restart):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "customers.parquet"
    pq.write_table(pa.table({"customer": ["ada", "bob"], "balance": [1.5, -2.0]}), out)
    _refused(inp, out, out, *restart, pattern="exists and is not forge output")
