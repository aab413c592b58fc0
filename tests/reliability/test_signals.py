"""SIGTERM / Ctrl-C drain a `forge run`: no new record starts, records in flight finish (or, on a
second signal, go back to the ledger), everything handed over is committed and written, and the exit
code says which signal stopped it (130 SIGINT, 143 SIGTERM; 0 only for a finished run). A rerun
completes the output."""
from __future__ import annotations

import signal
import time

import pytest

from forge.constants import EXIT_ERROR_ROWS
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    kill9,
    ledger_summary,
    read_rows,
    record_figures,
    resume_report,
    run_argv,
    start,
    wait_for_growth,
    write_echo_input,
)

pytestmark = pytest.mark.timeout(120)


def _interrupt(
    tmp, *, n: int, concurrency: int, signals: list[tuple[float, int]], node=NODES / "slow.yaml"
):
    """Start a run, wait until it writes rows, send each (delay, signal); returns (rc, stderr,
    seconds to exit)."""
    inp = write_echo_input(tmp / "in.jsonl", n)
    out = tmp / "out.jsonl"
    err = tmp / "run.err"
    proc = start(run_argv(ECHO, inp, out, node, "--concurrency", concurrency), stderr_path=err)
    try:
        assert wait_for_growth(out, proc, beyond=0, timeout_s=60), err.read_text()
        for delay, sig in signals:
            time.sleep(delay)
            proc.send_signal(sig)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        kill9(proc)
    text = err.read_text()
    assert_no_traceback(text)
    return inp, out, rc, text, took


def _resume(tmp, inp, out, n: int) -> dict:
    proc = start(run_argv(ECHO, inp, out, NODES / "instant.yaml"), stderr_path=tmp / "resume.err")
    # complete; echo fails some
    assert proc.wait(timeout=60) == EXIT_ERROR_ROWS, (tmp / "resume.err").read_text()
    text = (tmp / "resume.err").read_text()
    summary = assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    return {"report": resume_report(text), "ledger": summary}


def test_sigterm_drains_in_flight_records_and_exits_143(tmp_path):
    inp, out, rc, text, took = _interrupt(
        tmp_path, n=2000, concurrency=32, signals=[(0.5, signal.SIGTERM)]
    )
    assert rc == 143, text
    assert (
        "stopped by SIGTERM (every record in flight finished); run the same command again to resume"
        in text
    )
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    assert set(ledger["states"]) == {"written"}, ledger        # nothing in flight was left behind
    written = len(read_rows(out))
    assert 0 < written < 2000
    after = _resume(tmp_path, inp, out, 2000)
    # nothing to repair
    assert after["report"] == {"settled": written, "recovered": 0, "torn_bytes": 0}
    assert after["ledger"]["retried"] == 0  # nothing ran twice
    record_figures(
        "sigterm-drain",
        exit_code=rc,
        exit_s=round(took, 2),
        written_before_stop=written,
        left_pending=0,
        resumed_complete=True,
    )


def test_second_ctrl_c_returns_in_flight_records_to_the_ledger(tmp_path):
    inp, out, rc, text, took = _interrupt(tmp_path, n=2000, concurrency=256,
                                          signals=[(0.3, signal.SIGINT), (0.3, signal.SIGINT)])
    assert rc == 130, text
    assert (
        "stopped by SIGINT (" in text and "record(s) in flight went back to the ledger" in text
    ), text
    returned = int(text.split("stopped by SIGINT (", 1)[1].split(" ", 1)[0])
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    assert ledger["states"].get("pending", 0) == returned > 0, (ledger, returned)
    assert took < 10
    after = _resume(tmp_path, inp, out, 2000)
    assert after["ledger"]["retried"] == returned                   # exactly those ran again
    record_figures("sigint-twice", exit_code=rc, exit_s=round(took, 2), returned_to_ledger=returned,
                   retried_on_resume=after["ledger"]["retried"], resumed_complete=True)


def test_sigterm_after_the_input_was_read_still_drains(tmp_path):
    """The whole input fits the bounded queue, so the reader is done when the signal comes: forge
    must still stop starting records (it used to ignore the signal and run everything)."""
    inp, out, rc, text, took = _interrupt(
        tmp_path, n=300, concurrency=200, signals=[(0.2, signal.SIGTERM)]
    )
    assert rc == 143, text
    written = len(read_rows(out))
    assert written < 300, "the signal was ignored: every record ran"
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    assert set(ledger["states"]) == {"written"}, ledger
    _resume(tmp_path, inp, out, 300)


@pytest.mark.engine
@pytest.mark.long
@pytest.mark.timeout(300)
def test_sigterm_drains_the_real_tiny_engine(tmp_path):
    inp, out, rc, text, took = _interrupt(
        tmp_path, n=600, concurrency=64, signals=[(0.5, signal.SIGTERM)], node=None
    )
    assert rc == 143, text
    assert "every record in flight finished" in text
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    assert set(ledger["states"]) == {"written"}, ledger
    written = len(read_rows(out))
    after = _resume(tmp_path, inp, out, 600)
    assert after["report"]["recovered"] == 0 and after["ledger"]["retried"] == 0
    record_figures(
        "sigterm-drain-real", exit_code=rc, exit_s=round(took, 2), written_before_stop=written
    )


# --- a function blocking the event loop (issue 29, row 9)
# ---------------------------------------------------------
BLOCKS = '''
import os
import time

import forge


@forge.function(max_output_tokens=4)
async def blocker(record: dict, llm: forge.LLM) -> dict:
    if record["id"] == int(os.environ.get("BLOCK_AT", "-1")):
        time.sleep(float(os.environ["BLOCK_S"]))          # synchronous: holds the event loop
    out = await llm.generate(f"Say {record['id']}", max_tokens=2)
    return {"id": record["id"], "text": out.text}
'''


def _wait_for_text(path, proc, needle: str, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = path.read_text()
        if needle in text or proc.poll() is not None:
            return text
        time.sleep(0.05)
    return path.read_text()


def _blocking_run(tmp, n: int, node, block_at: int, block_s: float, env_extra: dict | None = None):
    fn = tmp / "block.py"
    fn.write_text(BLOCKS)
    inp = tmp / "in.jsonl"
    inp.write_text("".join(f'{{"id": {i}}}\n' for i in range(n)))
    out, err = tmp / "out.jsonl", tmp / "run.err"
    proc = start(
        run_argv(fn, inp, out, node, "--concurrency", 16),
        stderr_path=err,
        env_extra={"BLOCK_AT": str(block_at), "BLOCK_S": str(block_s), **(env_extra or {})},
    )
    return fn, inp, out, err, proc


def test_ctrl_c_twice_stops_at_once_while_a_function_blocks_the_loop(tmp_path):
    fn, inp, out, err, proc = _blocking_run(
        tmp_path, 600, NODES / "slow.yaml", block_at=150, block_s=120
    )
    try:
        text = _wait_for_text(err, proc, "the event loop has been blocked", 60)
        line = next((x for x in text.splitlines() if "the event loop has been blocked" in x), None)
        # function, file:line
        assert line is not None and "in blocker (" in line and "block.py:11)" in line, text
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        text = _wait_for_text(err, proc, "SIGINT: the event loop is blocked in blocker", 5)
        answered = time.monotonic() - t0
        assert "SIGINT: the event loop is blocked in blocker (" in text and answered < 1.5, (
            answered,
            text,
        )
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        kill9(proc)
    text = err.read_text()
    assert_no_traceback(text)
    assert rc == 130 and took < 1.5, (rc, took, text)
    assert (
        "SIGINT again: stopping now while blocker (" in text
        and "run the same command again" in text
    ), text
    before = {r["index"] for r in read_rows(out)} if out.exists() else set()
    # the same command (the function no longer blocks) resumes and completes; what was committed
    # stays
    r = start(run_argv(fn, inp, out, NODES / "instant.yaml"), stderr_path=tmp_path / "resume.err")
    assert r.wait(timeout=120) == 0, (tmp_path / "resume.err").read_text()
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), 600)
    assert before <= set(range(600)) and len(before) > 0
    record_figures(
        "blocked-loop-ctrl-c-twice",
        first_answered_s=round(answered, 2),
        exit_s=round(took, 2),
        rows_before_stop=len(before),
        exit_code=rc,
    )


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_a_function_blocking_the_loop_past_the_session_lease_costs_the_card_worker_nothing(
    tmp_path,
):
    """The worker used to drop a link session silent for its lease (60 s by default), so a node
    whose own loop was blocked that long lost its in-flight work and restarted its worker (one of
    its three restarts). Real tiny engine; the lease set to 10 s through the environment
    (FORGE_SESSION_LEASE_S), as an operator sets it."""
    # 16 s: a session silent since the block began would be past a 10 s lease at the first of the
    # worker's checks (every lease / 4 = 2.5 s) after 10 s, which comes by 12.5 s
    fn, inp, out, err, proc = _blocking_run(tmp_path, 120, None, block_at=40, block_s=16,
                                            env_extra={"FORGE_SESSION_LEASE_S": "10"})
    try:
        rc = proc.wait(timeout=360)
    finally:
        kill9(proc)
    text = err.read_text()
    for charged in ("went silent", "worker lost", "restart 1 of", "go back to the broker"):
        assert charged not in text, text
    assert_no_traceback(text)
    assert rc == 0, text
    assert text.count("the event loop has been blocked") == 1 and "in blocker (" in text, text
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), 120)
