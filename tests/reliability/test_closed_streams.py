"""A closed stdout or stderr never changes the exit code of a run that completed (issue 29, row 12):
`forge run ... 2>&1 | head -1` wrote every row and exited 1 ("refused before the run could start"),
no report. A real `forge run` subprocess whose stderr reader goes away after the first line, and one
started with its stdout and stderr closed."""
from __future__ import annotations

import subprocess

from tests.reliability._rel import (ECHO, NODES, assert_complete, env, forge_argv, write_echo_input)

N = 3000


def _argv(inp, out):
    return forge_argv("run", ECHO, "--node", NODES / "paced.yaml", "--input", inp, "--output", out,
                      "--progress", "lines", "--report")


def test_stderr_closed_after_the_first_line(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        _argv(inp, out), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    first = proc.stdout.readline()          # `| head -1`: one line, then the reader is gone
    proc.stdout.close()
    rc = proc.wait(timeout=300)
    assert first.strip(), first
    assert rc == 3, rc  # complete; echo fails some records on purpose (id % 97 == 13)
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    assert (tmp_path / "out.jsonl.report.json").exists() and (
        tmp_path / "out.jsonl.report.md"
    ).exists()


def test_stdout_and_stderr_closed_from_the_start(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", 300)
    out = tmp_path / "out.jsonl"
    argv = " ".join(f"'{a}'" for a in _argv(inp, out))
    rc = subprocess.run(["bash", "-c", f"exec {argv} >&- 2>&-"], env=env(), timeout=300).returncode
    assert rc == 3, rc
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 300)
    assert (tmp_path / "out.jsonl.report.json").exists()
