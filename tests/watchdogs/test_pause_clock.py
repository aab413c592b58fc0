"""forge/watchdogs/awake.py: time this process was not running is left out of a wait. A real pause
of the loop (blocked by time.sleep, which the heartbeat sees exactly like a SIGSTOP) is measured, a
short one is not."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from forge.watchdogs.awake import BEAT_S, GAP_S, pause_clock


def test_a_loop_that_did_not_run_is_left_out_of_the_wait():
    async def main():
        clock = pause_clock()
        since = time.monotonic()
        await asyncio.sleep(3 * BEAT_S)
        time.sleep(GAP_S + 1.0)  # the loop does not run: a pause of about 1.25 s past the beat
        asked_on_waking = clock.paused_since(since)         # before the heartbeat has run again
        await asyncio.sleep(3 * BEAT_S)
        wall = time.monotonic() - since
        return asked_on_waking, clock.paused_since(since), clock.awake_since(since), wall

    on_waking, paused, awake, wall = asyncio.run(main())
    assert GAP_S + 0.5 < on_waking <= GAP_S + 1.0 + 0.05, on_waking
    assert abs(paused - on_waking) < 0.1, (paused, on_waking)
    assert abs(awake + paused - wall) < 1e-3 and awake < wall - GAP_S, (awake, paused, wall)


def test_scheduling_noise_is_time_not_a_pause():
    async def main():
        clock = pause_clock()
        since = time.monotonic()
        for _ in range(8):
            await asyncio.sleep(BEAT_S / 2)
            time.sleep(GAP_S / 4)  # short stalls of the loop's own work stay counted as time
        return clock.paused_since(since)

    assert asyncio.run(main()) == 0.0


def test_a_sigstopped_process_counts_its_stop_as_a_pause(tmp_path):
    """The real thing: a child process measuring a 2 s SIGSTOP of itself."""
    code = ("import asyncio,time,sys\n"
            "from forge.watchdogs.awake import pause_clock\n"
            "async def main():\n"
            "    c=pause_clock(); t=time.monotonic(); print('ready',flush=True)\n"
            "    await asyncio.sleep(4.0)\n"
            "    print(round(c.paused_since(t),2), round(time.monotonic()-t,2), flush=True)\n"
            "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2.0)
        os.kill(proc.pid, signal.SIGCONT)
        paused, wall = map(float, proc.stdout.readline().split())
    finally:
        proc.kill()
        proc.wait()
    assert 1.5 < paused < 2.3 and wall >= 3.99, (paused, wall)
