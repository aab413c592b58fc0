"""Files forge writes beside the output (issue 29, rows 1 and 2 and the smaller file items): report
temps, the Parquet staging file and the ledger are created exclusively in the target folder, never
through a link, never over a file the run did not create; their names are checked against the input
like any other role. Real `forge run` subprocesses on the instant node; every refusal is exit 1 and
one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    run_argv,
    write_echo_input,
)

N = 10          # below echo's first failing record (id 13): a clean run exits 0


def _run(inp, out, *extra):
    return forge(*run_argv(ECHO, inp, out)[3:], *extra, timeout=120)


def _one_line_refusal(r, pattern: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert_no_traceback(r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("forge: ") and pattern in lines[0], r.stderr


@pytest.mark.parametrize("which", ["json", "md"])
def test_a_file_at_the_report_temp_name_is_never_written_nor_renamed(tmp_path, which):
    """Row 1: the input sits at OUT.report.<which>.tmp, and a symlink to a victim at the other temp
    name. Both stay byte for byte what they were; the report is written."""
    out = tmp_path / "out.jsonl"
    other = "md" if which == "json" else "json"
    inp = write_echo_input(tmp_path / f"out.jsonl.report.{which}.tmp", N)
    victim = tmp_path / "victim.txt"
    victim.write_text("not forge's\n")
    (tmp_path / f"out.jsonl.report.{other}.tmp").symlink_to(victim)
    before = inp.read_bytes()
    r = _run(inp, out, "--report")
    assert r.returncode == 0, r.stderr
    assert_no_traceback(r.stderr)
    assert inp.read_bytes() == before, "the input was overwritten by the report"
    assert victim.read_text() == "not forge's\n", "the symlink's target was overwritten"
    assert (tmp_path / f"out.jsonl.report.{other}.tmp").is_symlink()
    assert (tmp_path / "out.jsonl.report.json").read_text().startswith('{\n "format": '
                                                                       '"forge-run-report"')
    assert (tmp_path / "out.jsonl.report.md").read_text().startswith("# forge run report")
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    leftovers = sorted(
        p.name
        for p in tmp_path.iterdir()
        if ".report." in p.name
        and p.name.endswith(".tmp")
        and not p.name.startswith("out.jsonl.report.")
    )
    assert leftovers == [], leftovers


def test_the_input_named_as_the_report_is_refused_up_front(tmp_path):
    """Row 1: the names forge writes are checked against the input like any other role."""
    inp = write_echo_input(tmp_path / "out.jsonl.report.json", N)
    before = inp.read_bytes()
    r = _run(inp, tmp_path / "out.jsonl", "--report")
    _one_line_refusal(r, "the report is the same file as --input")
    assert inp.read_bytes() == before and not (tmp_path / "out.jsonl").exists()
    r = _run(inp, tmp_path / "out.jsonl", "--no-report")       # no report: nothing to refuse
    assert r.returncode == 0, r.stderr


def test_a_dangling_symlink_at_the_parquet_staging_name_is_refused(tmp_path):
    """Row 2: forge never creates a link's target; the link and its (absent) target stay as they
    were."""
    pytest.importorskip("pyarrow")
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    target = tmp_path / "elsewhere" / "taken.jsonl"
    target.parent.mkdir()
    staging = tmp_path / "out.parquet.staging.jsonl"
    staging.symlink_to(target)
    r = _run(inp, tmp_path / "out.parquet")
    _one_line_refusal(r, "is a symbolic link")
    assert not target.exists() and staging.is_symlink()
    assert not (tmp_path / "out.parquet").exists()


def test_a_symlink_to_a_file_at_the_parquet_staging_name_is_refused(tmp_path):
    pytest.importorskip("pyarrow")
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")  # empty: once looked like a fresh staging file
    (tmp_path / "out.parquet.staging.jsonl").symlink_to(victim)
    r = _run(inp, tmp_path / "out.parquet")
    _one_line_refusal(r, "is a symbolic link")
    assert victim.read_text() == ""


def test_ledger_dev_null_is_refused_and_leaves_nothing(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    journal = Path("/dev/null-journal")
    if journal.exists():
        pytest.skip("/dev/null-journal exists already (left by something else)")
    r = _run(inp, tmp_path / "out.jsonl", "--ledger", "/dev/null")
    _one_line_refusal(r, "is not a regular file")
    assert not journal.exists() and not Path("/dev/null-wal").exists()
    assert not (tmp_path / "out.jsonl").exists()


def test_an_output_below_a_file_is_one_line(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    (tmp_path / "existing_file").write_text("x\n")
    r = _run(inp, tmp_path / "existing_file" / "x.jsonl")
    _one_line_refusal(r, "existing_file")
    assert (tmp_path / "existing_file").read_text() == "x\n"


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_an_empty_input_is_not_already_complete_on_its_first_run(tmp_path, suffix):
    if suffix == "parquet":
        pytest.importorskip("pyarrow")
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"")
    out = tmp_path / f"out.{suffix}"
    r = _run(inp, out)
    assert r.returncode == 0, r.stderr
    assert "already complete" not in r.stderr and "holds no records" in r.stderr, r.stderr
    assert out.exists()
    if suffix == "jsonl":
        assert read_rows(out) == []
    r = _run(inp, out)                                  # the rerun: now it is complete
    assert r.returncode == 0 and "already complete" in r.stderr, r.stderr


def test_restart_never_takes_another_outputs_ledger_over(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    a = tmp_path / "a.jsonl"
    assert _run(inp, a).returncode == 0
    ledger_a = tmp_path / "a.jsonl.ledger.sqlite"
    before = ledger_a.read_bytes()
    r = _run(inp, tmp_path / "b.jsonl", "--ledger", ledger_a, "--restart")
    _one_line_refusal(r, "this ledger records the run writing a.jsonl")
    assert ledger_a.read_bytes() == before
    assert not (tmp_path / "b.jsonl").exists()
    r = _run(inp, a)                                    # a's own run still finds its ledger
    assert r.returncode == 0 and "already complete" in r.stderr, r.stderr
