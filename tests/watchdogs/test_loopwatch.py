"""The event loop's watchdog (forge/watchdogs/loopwatch.py) in a real subprocess: a loop blocked in
synchronous code is named once with its file:line; a process stopped (SIGSTOP) and woken is not
taken for a blocked loop; a signal reaches the loop's handler through the watchdog when the loop is
free."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = '''
import asyncio, sys, time
from forge.watchdogs.loopwatch import LoopWatch

async def main():
    got = []
    watch = LoopWatch(asyncio.get_running_loop(), got.append)
    assert watch.start()
    print("ready", flush=True)
    try:
        if sys.argv[1] == "block":
            await asyncio.sleep(0.3)
            time.sleep(3)                      # blocks the loop: line 13
        await asyncio.sleep(float(sys.argv[2]))
    finally:
        watch.close()
    print("signals", got, "reports", watch.blocked_reports, flush=True)

asyncio.run(main())
'''


def _start(tmp_path, *args) -> subprocess.Popen:
    script = tmp_path / "watched.py"
    script.write_text(SCRIPT)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
           # bytecode where the suite keeps it
           "PYTHONPYCACHEPREFIX": os.environ["PYTHONPYCACHEPREFIX"]}
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_blocked_loop_is_named_once_with_its_line(tmp_path):
    proc = _start(tmp_path, "block", "0.5")
    out, err = proc.communicate(timeout=30)
    assert "reports 1" in out, (out, err)
    assert (
        err.count("the event loop has been blocked") == 1
        and "in main (" in err
        and "watched.py:13)" in err
    ), err


def test_a_stopped_process_is_not_a_blocked_loop(tmp_path):
    proc = _start(tmp_path, "free", "4")
    time.sleep(0.5)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(3)
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    assert "reports 0" in out and "blocked" not in err, (out, err)


def test_a_signal_reaches_a_free_loop(tmp_path):
    proc = _start(tmp_path, "free", "2")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert "signals ['SIGTERM']" in out and proc.returncode == 0, (out, err)
