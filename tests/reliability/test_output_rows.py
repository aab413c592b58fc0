"""What an existing output holds is checked before anything is sized from it (issue 29, row 7): a
row whose index is 10**15, 10**30 or 8e9 was turned into a bitmap of that many bits (MemoryError,
OverflowError, or 1 GB just to be refused), even with --restart; a 5,000-digit index raised out of
int(). And a torn tail of a complete output whose ledger is intact is cut and its rows made again,
not refused. In-process (the output scan) and real `forge run` (the CLI paths)."""
from __future__ import annotations

import resource

import pytest

from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    resume_report,
    run_argv,
    write_echo_input,
)

N = 10


def _run(inp, out, *extra):
    return forge(*run_argv(ECHO, inp, out)[3:], *extra, timeout=120)


def _limit_memory():
    # a 1 GB bitmap (8e9) would not fit beside Python
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.slow
@pytest.mark.parametrize("index", [str(10**15), str(10**30), str(8 * 10**9), "9" * 5000])
def test_a_row_with_an_absurd_index_is_refused_in_one_line_and_restart_replaces_it(tmp_path, index):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    assert _run(inp, out).returncode == 0
    with open(out, "a") as f:
        f.write(f'{{"index": {index}, "result": 1}}\n')
    r = forge(*run_argv(ECHO, inp, out)[3:], timeout=120, preexec_fn=_limit_memory)
    assert_no_traceback(r.stderr)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "out.jsonl" in lines[0], r.stderr
    before = out.read_bytes()
    r = forge(*run_argv(ECHO, inp, out)[3:], "--restart", timeout=120, preexec_fn=_limit_memory)
    # past what Python reads as an int: no forge run writes that row, not forge output
    if len(index) > 4300:
        assert (
            r.returncode == 1 and "is not forge output" in r.stderr and out.read_bytes() == before
        ), r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)


def test_the_scan_never_sizes_a_bitmap_from_a_row(tmp_path):
    from forge.records.writer import OutputWriter

    out = tmp_path / "out.jsonl"
    out.write_text('{"index": 0, "result": 1}\n{"index": 1000000000000000, "result": 2}\n')
    w = OutputWriter(out)
    try:
        rec = w.scan(total=5)
    finally:
        w.close()
    assert rec.beyond == 1 and rec.first_beyond == 10**15 and list(rec.present) == [0]


@pytest.mark.slow
@pytest.mark.parametrize("cut", [1, 7, 30])
def test_a_torn_tail_of_a_complete_output_is_cut_and_its_rows_made_again(tmp_path, cut):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    assert _run(inp, out).returncode == 0
    whole = out.read_bytes()
    out.write_bytes(whole[:-cut])  # the last row (and with 30 bytes maybe more) loses its end
    r = _run(inp, out)
    assert_no_traceback(r.stderr)
    assert r.returncode == 0, r.stderr
    assert "pass --restart" not in r.stderr
    assert resume_report(r.stderr)["torn_bytes"] > 0, r.stderr
    assert "made again" in r.stderr, r.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    kept = whole[: whole.rstrip(b"\n").rfind(b"\n") + 1]  # every row before the torn one, untouched
    assert out.read_bytes().startswith(kept) and len(read_rows(out)) == N


@pytest.mark.slow
def test_rows_missing_from_the_middle_are_still_refused(tmp_path):
    """Only a cut end explains rows gone: a row removed from the middle is a change outside
    forge."""
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    assert _run(inp, out).returncode == 0
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3] + lines[4:]))
    r = _run(inp, out)
    assert r.returncode == 1 and "pass --restart" in r.stderr, r.stderr
