"""How much does a thread that wakes often cost transformers' generation loop? The bench's direct mode (longest
first, 128 deep) with and without one extra thread in the process that wakes every PERIOD_MS and runs WORK_US of
pure Python each time (what a card worker's driver thread does: it polled the engine every 5 ms), alternating,
each with a fresh manager:

    OMP_NUM_THREADS=1 python docs/bench/cpu-proxy/waker_ab.py WORKLOAD NODE RECORDS REPEATS PERIOD_MS WORK_US

Prints per run: window, engine steps, ms a step, and the waker's own CPU seconds."""
from __future__ import annotations

import sys
import threading
import time

from ab_setup import arms, direct_setup


def waker(stop: threading.Event, period_s: float, work_s: float, used: list) -> None:
    while not stop.wait(period_s):
        t0 = time.thread_time()
        end = time.perf_counter() + work_s
        n = 0
        while time.perf_counter() < end:      # pure Python: holds the GIL, as the driver's bookkeeping does
            n += 1
        used[0] += time.thread_time() - t0


def main(workload: str, node: str, records: str, repeats: str, period_ms: str, work_us: str) -> None:
    eng, reqs, warm = direct_setup(workload, node, records)
    for i in range(int(repeats)):
        for on in arms(i):
            stop, used = threading.Event(), [0.0]
            t = threading.Thread(target=waker, args=(stop, float(period_ms) / 1e3, float(work_us) / 1e6, used),
                                 daemon=True)
            if on:
                t.start()
            try:
                res = eng.run(reqs, "longest:128", warmup=warm)
            finally:
                stop.set()
            label = f"waker {period_ms} ms / {work_us} us" if on else "no waker"
            print(f"repeat {i + 1}  {label:24} window {res.window_s:6.2f} s  steps {res.engine_steps}  "
                  f"{1000 * res.window_s / res.engine_steps:6.2f} ms/step  waker CPU {used[0]:.2f} s", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
