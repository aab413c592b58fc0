"""Exit codes say what the output holds (issue 13, item 6): 0 only when every input line has its row
and none is an error; 3 complete with error rows; 4 incomplete (a truncated or grown input,
--max-errors, a node down). Real `forge run` subprocesses; the input is changed under a running
job."""
from __future__ import annotations

import json
import os

import pytest

from forge import constants
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge,
    ledger_summary,
    read_rows,
    record_figures,
    run_argv,
    start,
    wait_for_growth,
    write_echo_input,
)

ALL_FAIL = '''
import forge

@forge.function(max_output_tokens=8)
async def broken(record: dict, llm: forge.LLM) -> dict:
    raise ValueError("this function is broken")
'''
SOME_FAIL = '''
import forge

@forge.function(max_output_tokens=8)
async def some(record: dict, llm: forge.LLM) -> dict:
    if record["id"] % 10 == 0:                       # 10% fail
        raise ValueError("unlucky")
    out = await llm.generate(f"Say {record['id']}", max_tokens=2)
    return {"id": record["id"]}
'''


def _run(fn, inp, out, *extra, node=NODES / "instant.yaml"):
    return forge(*run_argv(fn, inp, out, node)[3:], *extra, timeout=300)


def _last_line(r) -> str:
    return r.stderr.strip().splitlines()[-1]


def test_zero_only_when_every_line_has_a_row_and_none_is_an_error(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", 13)  # ids 0..12: echo fails none of them
    r = _run(ECHO, inp, tmp_path / "clean.jsonl")
    assert r.returncode == constants.EXIT_OK == 0, r.stderr
    inp = write_echo_input(tmp_path / "in14.jsonl", 14)                 # id 13 fails
    r = _run(ECHO, inp, tmp_path / "one-error.jsonl")
    assert r.returncode == constants.EXIT_ERROR_ROWS == 3, r.stderr
    assert "complete, with error rows: 1 of the 14 rows" in _last_line(r)
    r = _run(ECHO, inp, tmp_path / "one-error.jsonl")  # the rerun of a complete job says the same
    assert (
        r.returncode == 3
        and "already complete: all 14 records are in it (1 of them error rows)" in _last_line(r)
    ), r.stderr


def test_a_run_where_every_record_failed_is_not_zero(tmp_path):
    (tmp_path / "broken.py").write_text(ALL_FAIL)
    inp = write_echo_input(tmp_path / "in.jsonl", 50)
    r = _run(tmp_path / "broken.py", inp, tmp_path / "out.jsonl")
    assert r.returncode == 3 and "50 of the 50 rows" in _last_line(r), r.stderr


@pytest.mark.parametrize("limit", ["5", "100", "5%", "50%"])
def test_max_errors_stops_a_broken_function_early_and_the_job_resumes(tmp_path, limit):
    (tmp_path / "broken.py").write_text(ALL_FAIL)
    inp = write_echo_input(tmp_path / "in.jsonl", 3000)
    out = tmp_path / "out.jsonl"
    r = _run(tmp_path / "broken.py", inp, out, "--max-errors", limit, "--concurrency", "8")
    assert_no_traceback(r.stderr)
    rows = read_rows(out)
    assert r.returncode == constants.EXIT_INCOMPLETE, r.stderr
    assert f"more than --max-errors {limit}" in _last_line(
        r
    ) and "run the same command again" in _last_line(r)
    floor = int(limit) + 1 if limit.isdigit() else constants.MAX_ERRORS_MIN_SAMPLE
    assert floor <= len(rows) < 3000 and all("error" in row for row in rows)
    stopped_after = len(rows)
    r = _run(tmp_path / "broken.py", inp, out)  # no limit: the same command completes
    assert r.returncode == 3, r.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 3000)
    record_figures(
        f"max-errors-{limit}", records=3000, error_rows_when_stopped=stopped_after, concurrency=8
    )


def test_a_share_counts_only_after_the_minimum_sample(tmp_path):
    (tmp_path / "some.py").write_text(SOME_FAIL)
    inp = write_echo_input(tmp_path / "in.jsonl", 1000)
    # 10% fail: under 20%
    r = _run(tmp_path / "some.py", inp, tmp_path / "a.jsonl", "--max-errors", "20%")
    assert r.returncode == 3, r.stderr
    # 10% > 5%: stops
    r = _run(tmp_path / "some.py", inp, tmp_path / "b.jsonl", "--max-errors", "5%")
    assert r.returncode == 4 and "more than --max-errors 5%" in r.stderr, r.stderr
    assert len(read_rows(tmp_path / "b.jsonl")) >= constants.MAX_ERRORS_MIN_SAMPLE


@pytest.mark.parametrize("bad", ["-1", "0%", "101%", "five", "1.5"])
def test_a_bad_max_errors_is_a_usage_error(tmp_path, bad):
    inp = write_echo_input(tmp_path / "in.jsonl", 3)
    r = _run(ECHO, inp, tmp_path / "out.jsonl", "--max-errors", bad)
    assert (
        r.returncode == 2 and "--max-errors" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ), r.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("change", ["truncate", "append"])
def test_an_input_changed_mid_run_never_ends_in_zero(tmp_path, change):
    # truncated: the case, 20,000 paced records (~14 s) cut to 2/5 early; appended: the
    # change shows when the run reaches the end, so 5,000 (~4 s) do
    n = 20_000 if change == "truncate" else 5_000
    inp = write_echo_input(tmp_path / "in.jsonl", n)
    out = tmp_path / "out.jsonl"
    proc = start(run_argv(ECHO, inp, out, NODES / "paced.yaml"), stderr_path=tmp_path / "run.err")
    try:
        assert wait_for_growth(out, proc, beyond=20_000, timeout_s=60)
        size = inp.stat().st_size
        if change == "truncate":
            os.truncate(inp, size * 2 // 5)  # the case: 7,993 of 20,000 rows, exit 0
        else:
            with open(inp, "a") as f:
                f.write(
                    "".join(json.dumps({"id": n + i, "text": "late"}) + "\n" for i in range(500))
                )
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "run.err").read_text()
    assert_no_traceback(err)
    assert rc == constants.EXIT_INCOMPLETE, err
    assert "changed during the run" in err and "--restart" in err
    rows = read_rows(out)
    assert all(row["index"] < n for row in rows)  # nothing past the lines counted at the start
    if change == "truncate":
        assert len(rows) < n
    s = ledger_summary(tmp_path / "out.jsonl.ledger.sqlite")
    assert s["stored_rows"] == 0
    name = {"truncate": "input-truncated-mid-run", "append": "input-appended-mid-run"}[change]
    record_figures(name, records_counted=n, rows=len(rows), exit_code=rc,
                   message=err.strip().splitlines()[-1])


def test_help_lists_the_exit_codes():
    for cmd in ("run", "deploy"):
        r = forge(cmd, "--help")
        assert r.returncode == 0
        text = " ".join(r.stdout.split())
        for line in ("0 complete: every input line has its row, none is an error row",
                     "3 complete, with error rows", "4 incomplete: rows are missing",
                     "130 incomplete: stopped by SIGINT"):
            assert line in text, (cmd, r.stdout)


# The README's table, for every refusal: 1 when something the command line names was checked and
# refused (a file or node that is missing, unreadable, unreachable or not what forge needs), 2 when
# the command line itself is wrong (a flag missing or unknown, a value of the wrong shape). Issue
# 29: a missing function file, an unknown function name and an unreachable --node URL exited 2; a
# folder as --input exited 2 too.
REFUSALS = [
    ("input file missing", 1, ["run", "{echo}", "--input", "{tmp}/nope.jsonl"]),
    ("input is a folder", 1, ["run", "{echo}", "--input", "{tmp}"]),
    ("function file missing", 1, ["run", "{tmp}/nope.py"]),
    ("function name unknown", 1, ["run", "{echo}:nosuch"]),
    ("no function in the file", 1, ["run", "{tmp}/empty.py"]),
    ("function file fails at import", 1, ["run", "{tmp}/raises.py"]),
    ("node description missing", 1, ["run", "{echo}", "--node", "{tmp}/nope.yaml"]),
    ("node description is a folder", 1, ["run", "{echo}", "--node", "{tmp}/"]),
    ("node name unknown", 1, ["run", "{echo}", "--node", "nosuch"]),
    ("deploy: node URL unreachable", 1, ["deploy", "{echo}", "--node", "http://127.0.0.1:{port}"]),
    ("deploy: node name not provisioned", 1, ["deploy", "{echo}", "--node", "nosuch"]),
    ("deploy: no node provisioned", 1, ["deploy", "{echo}"]),
    ("output is a folder", 1, ["run", "{echo}", "--output", "{tmp}"]),
    ("output below a file", 1, ["run", "{echo}", "--output", "{tmp}/empty.py/out.jsonl"]),
    ("ledger is a folder", 1, ["run", "{echo}", "--ledger", "{tmp}"]),
    ("--input not given", 2, ["run", "{echo}", "--no-input"]),
    ("unknown flag", 2, ["run", "{echo}", "--bogus"]),
    ("target not FILE.py", 2, ["run", "{tmp}/echo.txt"]),
    ("--max-errors malformed", 2, ["run", "{echo}", "--max-errors", "five"]),
    ("--concurrency 0", 2, ["run", "{echo}", "--concurrency", "0"]),
    ("run given a node URL", 2, ["run", "{echo}", "--node", "http://127.0.0.1:1"]),
    ("deploy: --node and --cluster", 2, ["deploy", "{echo}", "--node", "x", "--cluster", "auto"]),
]


@pytest.mark.parametrize("what, code, argv", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_refusal_exits_as_the_table_says(tmp_path, what, code, argv):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                    # nothing listens here once closed
    (tmp_path / "empty.py").write_text("import forge\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('at import')\n")
    inp = write_echo_input(tmp_path / "in.jsonl", 3)
    args = [a.format(echo=ECHO, tmp=tmp_path, port=port) for a in argv]
    if "--input" not in args and "--no-input" not in args:
        args += ["--input", str(inp)]
    args = [a for a in args if a != "--no-input"]
    if "--output" not in args:
        args += ["--output", str(tmp_path / "out.jsonl")]
    if args[0] == "run" and "--node" not in args:
        args += ["--node", str(NODES / "instant.yaml")]
    r = forge(*args, timeout=120, env_extra={"FORGE_HOME": str(tmp_path / "home")})
    assert_no_traceback(r.stderr)
    assert r.returncode == code, (what, r.returncode, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines and (code == 2 or len(lines) == 1), r.stderr
    assert not (tmp_path / "out.jsonl").exists(), "a refused run left its output behind"
