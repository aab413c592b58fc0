"""The first Ctrl-C says at once what forge is doing and how to stop now; the second stops now. A
real `forge run` in a subprocess, real SIGINTs."""
import signal
import time

import pytest

from tests.reliability._rel import NODES, kill9, run_argv, start, wait_for_growth, write_echo_input

FIXTURE = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "dawdle.py"


def _wait_for(path, text: str, proc, timeout_s: float) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        got = path.read_text()
        if text in got:
            return got
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.timeout(120)
def test_first_ctrl_c_says_what_is_happening_and_the_second_stops_now(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", 200)
    out, err = tmp_path / "out.jsonl", tmp_path / "run.err"
    proc = start(
        run_argv(FIXTURE, inp, out, NODES / "instant.yaml", "--concurrency", 16), stderr_path=err
    )
    try:
        assert wait_for_growth(out, proc, beyond=0, timeout_s=60), err.read_text()
        t0 = time.monotonic()
        # records 0-3 written
        while len(out.read_text().splitlines()) < 4 and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        text = _wait_for(err, "press Ctrl-C again", proc, 5)
        # said while the drain is still going on (the records in flight sleep for a minute)
        assert proc.poll() is None
        assert ("forge: SIGINT: stopping — no new record starts; waiting up to 30 s for the 16 "
                "record(s) in flight "
                "to finish; press Ctrl-C again to stop now (they stay in the ledger and run next "
                "time)") in text, text
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    finally:
        kill9(proc)
    text = err.read_text()
    assert rc == 130, text
    assert "forge: SIGINT again: stopping now; 16 record(s) in flight go back to the ledger" in text
    assert "Traceback" not in text


@pytest.mark.engine
@pytest.mark.timeout(120)
def test_ctrl_c_while_the_engine_loads_stops_at_once(tmp_path):
    """The ledger is opened before the node starts; a Ctrl-C then lands while the real engine loads
    in its thread. Python's own handling would wait for that thread (it hung: the engine's threads
    never stopped)."""
    inp = write_echo_input(tmp_path / "in.jsonl", 20)
    out, err = tmp_path / "out.jsonl", tmp_path / "run.err"
    proc = start(run_argv(FIXTURE, inp, out, None), stderr_path=err)
    try:
        ledger = out.with_name("out.jsonl.ledger.sqlite")
        t0 = time.monotonic()
        while not ledger.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
    finally:
        kill9(proc)
    assert rc == 130
    assert (
        err.read_text().strip()
        == "forge: SIGINT before any record ran (the output is as it was): stopping now"
    )
    assert not out.exists() or out.read_text() == ""
