"""Ctrl-C before a command has anything to drain exits at once even when the kernel hands the signal
to another thread while the main thread is blocked in a system call (Python runs the handler only in
the main thread, once it runs Python again: `forge run` once sat over 10 s past a Ctrl-C while its
node loaded). Real process, real signal."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import os, signal, socket, sys, threading, time
    from forge.cli.interrupt import exit_at_once_until_draining

    exit_at_once_until_draining("in the test")
    a, b = socket.socketpair()

    def other():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)   # delivered to this thread, not the main one
        time.sleep(60)

    threading.Thread(target=other, daemon=True).start()
    print("ready", flush=True)
    a.recv(1)                      # the main thread blocks in a system call nobody will end
    print("main thread woke", flush=True)
""")


def test_a_signal_taken_by_another_thread_still_exits_at_once():
    t0 = time.monotonic()
    # started with SIGINT blocked, as a process Ray launches is: forge takes it back
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=15,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}),
    )
    took = time.monotonic() - t0
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "ready\n"
    assert proc.stderr == "forge: SIGINT in the test: stopping now\n"
    assert took < 10, took
