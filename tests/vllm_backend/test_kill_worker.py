"""A card worker running vLLM, SIGKILLed mid-job: nothing is orphaned (the engine core runs in the
worker's own process, so the worker has no child to leave behind), the card comes back in a new
worker, and every record settles exactly once, each record's function run once."""
from __future__ import annotations

import json
import os
import signal

import pytest

from forge.constants import EXIT_ERROR_ROWS
from tests.node.test_worker_lifecycle import worker_pids
from tests.reliability._rel import (
    ECHO,
    assert_complete,
    assert_no_traceback,
    kill9,
    read_rows,
    run_argv,
    start,
    wait_for_growth,
    write_echo_input,
)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.timeout(900)
def test_a_vllm_worker_killed_mid_job_leaves_no_orphan_and_every_record_settles_once(tmp_path):
    n = 2000
    inp = write_echo_input(tmp_path / "in.jsonl", n)
    out, log, err = tmp_path / "out.jsonl", tmp_path / "invocations.log", tmp_path / "run.err"
    argv = run_argv(ECHO, inp, out, "local-vllm")
    argv.remove("--no-report")
    proc = start(
        argv,
        stderr_path=err,
        env_extra={
            "FORGE_TEST_INVOCATIONS": str(log),
            "FORGE_TEST_MAX_TOKENS": "8",
            "FORGE_HOME": str(tmp_path / "home"),
        },
    )
    try:
        assert wait_for_growth(out, proc, beyond=2000, timeout_s=400), err.read_text()[-3000:]
        (victim,) = worker_pids(proc.pid)
        assert children(victim) == []  # vLLM spawned nothing: no process can outlive the worker
        os.kill(victim, signal.SIGKILL)
        rows_at_kill = len(read_rows(out))
        rc = proc.wait(timeout=600)
    finally:
        kill9(proc)
    text = err.read_text()
    assert rc == EXIT_ERROR_ROWS, text[-3000:]  # complete; echo fails id % 97 == 13 on purpose
    assert_no_traceback(text)
    assert "card cpu0: worker lost" in text and "(restart 1 of 3)" in text, text[-3000:]
    assert rows_at_kill < n
    assert not os.path.exists(f"/proc/{victim}")       # reaped, not a zombie holding the card
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    invoked = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert sorted(invoked) == list(range(n))           # no record's function ran twice
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert report["summary"]["requeued"] >= 1, report["summary"]
