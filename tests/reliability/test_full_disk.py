"""The output's disk fills up during a `forge run`: the run stops with one line naming the file and
the reason, and once there is room again the same command finishes the output, every record exactly
once.

Two ways to fill a disk: a real small tmpfs (needs mount, i.e. root; skipped otherwise) gives ENOSPC
for the output and the ledger alike; RLIMIT_FSIZE (any user) makes every write past the limit fail
with EFBIG."""
from __future__ import annotations

import resource
import signal
import subprocess
import uuid

import pytest

from forge.constants import EXIT_ERROR_ROWS, EXIT_INCOMPLETE
from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    ledger_summary,
    record_figures,
    resume_report,
    run_argv,
    start,
    write_echo_input,
)

pytestmark = pytest.mark.timeout(120)
N = 20000


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir()
    r = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size}",
            f"forge-test-{uuid.uuid4().hex[:8]}",
            str(path),
        ],
        capture_output=True,
    )
    return r.returncode == 0


def _one_line_failure(text: str) -> str:
    assert_no_traceback(text)
    last = text.strip().splitlines()[-1]
    return last


def test_full_tmpfs_stops_the_run_cleanly_and_a_rerun_completes(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("cannot mount a tmpfs here (not root); the RLIMIT_FSIZE test covers the path")
    try:
        inp = write_echo_input(tmp_path / "in.jsonl", N)
        out = disk / "out.jsonl"
        proc = start(run_argv(ECHO, inp, out), stderr_path=tmp_path / "full.err")
        rc = proc.wait(timeout=60)
        last = _one_line_failure((tmp_path / "full.err").read_text())
        assert rc == EXIT_INCOMPLETE, last
        assert ("out.jsonl: cannot write the output: No space left on device" in last
                or "ledger write failed: database or disk is full" in last), last
        written = out.read_bytes().count(b"\n")        # complete lines; a torn tail may follow
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        proc = start(run_argv(ECHO, inp, out), stderr_path=tmp_path / "resume.err")
        # echo fails some
        assert proc.wait(timeout=60) == EXIT_ERROR_ROWS, (tmp_path / "resume.err").read_text()
        report = resume_report((tmp_path / "resume.err").read_text())
        summary = assert_complete(out, disk / "out.jsonl.ledger.sqlite", N)
        record_figures(
            "full-disk-tmpfs",
            size="256 KiB",
            exit_code=rc,
            message=last.split(": ", 1)[1],
            rows_when_full=written,
            torn_bytes_cut=report["torn_bytes"],
            recovered_from_ledger=report["recovered"],
            retried=summary["retried"],
            resumed_complete=True,
        )
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write() instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_file_size_limit_stops_the_run_cleanly_and_a_rerun_completes(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    proc = start(
        run_argv(ECHO, inp, out),
        stderr_path=tmp_path / "full.err",
        preexec_fn=_limit_file_size(300_000),
    )
    rc = proc.wait(timeout=60)
    last = _one_line_failure((tmp_path / "full.err").read_text())
    assert rc == EXIT_INCOMPLETE, last
    assert "cannot write the output: File too large" in last or "ledger write failed" in last, last
    written = out.read_bytes().count(b"\n")
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    proc = start(run_argv(ECHO, inp, out), stderr_path=tmp_path / "resume.err")
    # echo fails some
    assert proc.wait(timeout=60) == EXIT_ERROR_ROWS, (tmp_path / "resume.err").read_text()
    report = resume_report((tmp_path / "resume.err").read_text())
    summary = assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), N)
    record_figures(
        "full-disk-rlimit",
        limit_bytes=300_000,
        exit_code=rc,
        message=last.split(": ", 1)[1],
        rows_when_full=written,
        ledger_when_full=ledger["states"],
        torn_bytes_cut=report["torn_bytes"],
        recovered_from_ledger=report["recovered"],
        retried=summary["retried"],
        resumed_complete=True,
    )
